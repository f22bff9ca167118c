// E2B's desktop SDK (@e2b/desktop, unchanged) against `hutch serve` over
// TLS, set up as against E2B's cloud: only E2B_API_KEY and E2B_DOMAIN.
// Sandbox.create() names no template: the SDK's default, "desktop".
// HUTCH_OTHER_KEY is another tenant's key; HUTCH_RESOLUTION the size the
// create asks for (WxH).

import { Sandbox } from '@e2b/desktop'
import { Sandbox as Plain } from 'e2b'
import { assert, check, done, runID } from '../e2b/lib.mjs'
import { changedPixels, decodePNG, pngSize } from './png.mjs'
import { vncHandshake } from './rfb.mjs'
import { playwrightChecks, puppeteerChecks, refusedWithoutToken } from './cdp-lib.mjs'

const domain = process.env.E2B_DOMAIN
const [width, height] = (process.env.HUTCH_RESOLUTION || '1280x800').split('x').map(Number)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Polls fn until it returns a truthy value, for at most ms.
async function until(what, fn, ms = 20_000) {
  const end = Date.now() + ms
  let last
  while (Date.now() < end) {
    try {
      last = await fn()
      if (last) return last
    } catch (err) {
      last = err
    }
    await sleep(250)
  }
  throw new Error(`${what}: not within ${ms} ms (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`)
}

async function shot(desktop) {
  return decodePNG(Buffer.from(await desktop.screenshot()))
}

const desktop = await check(
  `Sandbox.create() of the default template at ${width}x${height}`,
  async (note) => {
    const t0 = Date.now()
    const sb = await Sandbox.create({ resolution: [width, height], metadata: { run: runID }, timeoutMs: 900_000 })
    note(`sandbox ${sb.sandboxId} created, its desktop up, in ${Date.now() - t0} ms`)
    const info = await sb.getInfo()
    assert.ok([info.templateId, info.name].includes('desktop'), `template ${info.templateId} (${info.name})`)
    return sb
  },
  { fatal: true, timeoutMs: 300_000 },
)

let before
await check('screenshot() is a PNG of the size asked for', async (note) => {
  const t0 = Date.now()
  const png = Buffer.from(await desktop.screenshot())
  note(`screenshot in ${Date.now() - t0} ms, ${png.length} bytes`)
  assert.deepEqual(pngSize(png), { width, height })
  before = decodePNG(png)
})

await check('getScreenSize() is the size asked for', async () => {
  assert.deepEqual(await desktop.getScreenSize(), { width, height })
})

await check('moveMouse then getCursorPosition agree', async () => {
  await desktop.moveMouse(321, 234)
  assert.deepEqual(await desktop.getCursorPosition(), { x: 321, y: 234 })
  await desktop.moveMouse(width - 10, height - 10)
  assert.deepEqual(await desktop.getCursorPosition(), { x: width - 10, y: height - 10 })
})

if (process.env.HUTCH_DESKTOP_SCREEN_ONLY === '1') {
  // The second size: the screen's checks are enough.
  console.log(`KEEP ${desktop ? desktop.sandboxId : ''}`)
  done()
  await new Promise((resolve) => process.stdout.write('', resolve))
  process.exit()
}

await check("launch('xfce4-terminal') opens a window: the screen's pixels change", async (note) => {
  await desktop.launch('xfce4-terminal')
  const windows = await until('a terminal window', async () => {
    const ids = (await desktop.getApplicationWindows('xfce4-terminal')).filter(Boolean)
    return ids.length ? ids : null
  })
  note(`terminal windows ${windows.join(' ')}: "${await desktop.getWindowTitle(windows[0])}"`)
  const after = await until('the terminal drawn', async () => {
    const img = await shot(desktop)
    return changedPixels(before, img) > 10_000 ? img : null
  })
  note(`${changedPixels(before, after)} of ${width * height} pixels changed`)
  await desktop.write('echo typed-into-the-terminal > /tmp/typed.txt\n')
  const typed = await until('the typed command run', async () => {
    try {
      return await desktop.files.read('/tmp/typed.txt')
    } catch {
      return null
    }
  })
  assert.equal(typed, 'typed-into-the-terminal\n')
  await desktop.press(['ctrl', 'shift', 'w'])
  // xdotool search exits 1 when it finds no window.
  await until('the terminal closed', async () => (await desktop.commands.run('xdotool search --onlyvisible --class xfce4-terminal || true')).stdout.trim() === '')
})

await check('write into the editor and press ctrl+s: the file holds the text', async (note) => {
  await desktop.files.write('/home/user/note.txt', '')
  await desktop.launch('org.xfce.mousepad', '/home/user/note.txt')
  const win = await until('a Mousepad window', async () => (await desktop.getApplicationWindows('mousepad')).filter(Boolean)[0])
  await until('the window focused', async () => (await desktop.getCurrentWindowId()) === win)
  assert.match(await desktop.getWindowTitle(win), /note\.txt/)
  note(`window ${win}: "${await desktop.getWindowTitle(win)}"`)
  const text = "Hello from hutch's desktop: 'quotes' & $dollars"
  await desktop.write(text)
  await desktop.press(['ctrl', 's'])
  const saved = await until('the file saved', async () => {
    const s = await desktop.files.read('/home/user/note.txt')
    return s.includes(text) ? s : null
  })
  assert.equal(saved.trimEnd(), text)
  await desktop.press(['ctrl', 'q'])
})

await check('leftClick, rightClick, doubleClick, middleClick, drag and scroll run', async () => {
  await desktop.moveMouse(Math.floor(width / 2), Math.floor(height / 2))
  await desktop.rightClick()
  await sleep(300)
  const menu = await shot(desktop)
  await desktop.press('Escape')
  await desktop.leftClick(10, 10)
  await desktop.doubleClick(Math.floor(width / 2), Math.floor(height / 2))
  await desktop.middleClick()
  await desktop.drag([100, 100], [200, 200])
  assert.deepEqual(await desktop.getCursorPosition(), { x: 200, y: 200 })
  await desktop.scroll('down', 2)
  await desktop.scroll('up', 1)
  // The desktop's right-click menu drew something.
  assert.ok(changedPixels(before, menu) > 500, 'the right-click menu changed nothing on the screen')
})

let streamUrl
await check('stream.start() gives the noVNC URL the SDK builds, served through the port routing', async (note) => {
  await desktop.stream.start()
  streamUrl = desktop.stream.getUrl()
  note(streamUrl)
  const u = new URL(streamUrl)
  assert.equal(u.protocol, 'https:')
  assert.equal(u.host, `6080-${desktop.sandboxId}.${domain}`)
  assert.equal(u.pathname, '/vnc.html')
  const page = await fetch(streamUrl)
  assert.equal(page.status, 200)
  assert.match(await page.text(), /noVNC/)
  const core = await fetch(new URL('/core/rfb.js', streamUrl))
  assert.equal(core.status, 200)
})

await check('the stream completes a VNC handshake without a password, at the screen size', async (note) => {
  const h = await vncHandshake(streamUrl)
  note(JSON.stringify(h))
  assert.equal(h.result, 'ok')
  assert.ok(h.types.includes(1), `security types ${h.types}`)
  assert.deepEqual([h.width, h.height], [width, height])
})

await check('stream.start({ requireAuth: true }) refuses without its key and opens with it', async (note) => {
  await desktop.stream.stop()
  await until('x11vnc stopped', async () => (await desktop.commands.run('pgrep -x x11vnc || true')).stdout.trim() === '')
  await desktop.stream.start({ requireAuth: true })
  const key = desktop.stream.getAuthKey()
  const url = desktop.stream.getUrl({ authKey: key })
  assert.equal(new URL(url).searchParams.get('password'), key)
  const without = await vncHandshake(url)
  note(`without the key: ${JSON.stringify(without)}`)
  assert.ok(!without.types.includes(1), `the server offers no-auth: ${without.types}`)
  assert.match(without.result, /^refused/)
  const withKey = await vncHandshake(url, { password: key })
  note(`with the key: ${JSON.stringify(withKey)}`)
  assert.equal(withKey.result, 'ok')
  assert.deepEqual([withKey.width, withKey.height], [width, height])
})

let cdpUrl
await check("POST /sandboxes/{id}/browser: Chromium on the desktop's screen, and a wss:// URL Playwright and Puppeteer drive", async (note) => {
  await desktop.files.write('/tmp/www/index.html', '<!doctype html><title>hutch page</title><body data-answer="42">in the sandbox</body>')
  await (await desktop.commands.run('python3 -m http.server -d /tmp/www -b 127.0.0.1 8000', { background: true, timeoutMs: 0 })).disconnect()
  await until('the page served', async () => (await desktop.commands.run('curl -fsS http://127.0.0.1:8000/ || true')).stdout.includes('hutch page'))
  const screen = await shot(desktop)
  const t0 = Date.now()
  const res = await fetch(`https://api.${domain}/sandboxes/${desktop.sandboxId}/browser`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ headless: false }),
  })
  const body = await res.json()
  assert.equal(res.status, 200, JSON.stringify(body))
  note(`browser started in ${Date.now() - t0} ms: ${body.cdpUrl.replace(/hutch_token=.*/, 'hutch_token=...')}`)
  cdpUrl = body.cdpUrl
  assert.ok(cdpUrl.startsWith(`wss://9222-${desktop.sandboxId}.${domain}/devtools/browser?hutch_token=`), cdpUrl)
  for (const n of await playwrightChecks(cdpUrl, { pageUrl: 'http://127.0.0.1:8000/', title: 'hutch page' })) note(n)
  for (const n of await puppeteerChecks(cdpUrl, { pageUrl: 'http://127.0.0.1:8000/', title: 'hutch page' })) note(n)
  const shown = await shot(desktop)
  assert.ok(changedPixels(screen, shown) > 10_000, "Chromium's window changed nothing on the screen")
  const again = await fetch(`https://api.${domain}/sandboxes/${desktop.sandboxId}/browser`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ headless: false }),
  })
  assert.equal((await again.json()).cdpUrl, cdpUrl, 'a second start gave another URL')
}, { timeoutMs: 180_000 })

await check('the DevTools URL without its token, or with another, opens nothing', async () => {
  assert.ok(cdpUrl, 'no DevTools URL')
  await refusedWithoutToken(cdpUrl)
})

await check('POST /sandboxes/{id}/recordings and .../stop: an MP4 of the screen, read through files', async (note) => {
  const api = `https://api.${domain}/sandboxes/${desktop.sandboxId}/recordings`
  const headers = { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' }
  const start = await fetch(api, { method: 'POST', headers, body: JSON.stringify({ fps: 15 }) })
  const rec = await start.json()
  assert.equal(start.status, 201, JSON.stringify(rec))
  assert.equal(rec.size, `${width}x${height}`)
  await desktop.moveMouse(100, 100)
  await sleep(500)
  await desktop.moveMouse(400, 300)
  await sleep(500)
  const stop = await fetch(`${api}/${rec.recordingID}/stop`, { method: 'POST', headers, body: '{}' })
  const stopped = await stop.json()
  assert.equal(stop.status, 200, JSON.stringify(stopped))
  const video = Buffer.from(await desktop.files.read(stopped.path, { format: 'bytes' }))
  note(`${stopped.path}: ${video.length} bytes`)
  assert.equal(video.length, stopped.bytes)
  assert.equal(video.toString('latin1', 4, 8), 'ftyp')
  const again = await fetch(`${api}/${rec.recordingID}/stop`, { method: 'POST', headers, body: '{}' })
  assert.equal(again.status, 404)
  const bad = await fetch(api, { method: 'POST', headers, body: JSON.stringify({ fps: 500 }) })
  assert.equal(bad.status, 400)
})

await check('another tenant reaches none of it', async () => {
  const other = process.env.HUTCH_OTHER_KEY
  let err
  try {
    await Plain.connect(desktop.sandboxId, { apiKey: other })
  } catch (e) {
    err = e
  }
  assert.ok(err, "another tenant's key connected to the desktop")
  const list = await Plain.list({ apiKey: other }).nextItems()
  assert.ok(!list.some((s) => s.sandboxId === desktop.sandboxId), "the desktop is in another tenant's list")
  const res = await fetch(`https://49983-${desktop.sandboxId}.${domain}/files?path=/home/user/note.txt`, { headers: { 'X-Access-Token': 'not-the-token' } })
  assert.notEqual(res.status, 200)
  const browser = await fetch(`https://api.${domain}/sandboxes/${desktop.sandboxId}/browser`, {
    method: 'POST',
    headers: { 'X-API-Key': other, 'Content-Type': 'application/json' },
    body: '{}',
  })
  assert.equal(browser.status, 404, "another tenant's key started the desktop's browser")
  const rec = await fetch(`https://api.${domain}/sandboxes/${desktop.sandboxId}/recordings`, {
    method: 'POST',
    headers: { 'X-API-Key': other, 'Content-Type': 'application/json' },
    body: '{}',
  })
  assert.equal(rec.status, 404, "another tenant's key recorded the desktop's screen")
})

console.log(`KEEP ${desktop ? desktop.sandboxId : ''}`)
done()
// The SDK's HTTP agents keep connections open: end once the lines are out.
await new Promise((resolve) => process.stdout.write('', resolve))
process.exit()
