// Terminals through the E2B SDK's sandbox.pty are terminals of the
// sandbox's own: `tty` and Python's os.ttyname name a /dev/pts device,
// a resize reaches `stty size`, job control works, ^C ends the
// foreground job only, and a terminal lives through pause and resume.
import { Sandbox } from 'e2b'
import { check, done, assert, waitFor, killAll, runID } from './lib.mjs'

let sandbox

await check(
  'create a sandbox from the base template',
  async () => {
    sandbox = await Sandbox.create('base', { timeoutMs: 600_000, metadata: { suite: 'pty', run: runID }, requestTimeoutMs: 120_000 })
  },
  { fatal: true, timeoutMs: 150_000 },
)

await check('pty: tty, ttyname, resize, job control, ^C', async () => {
  let out = ''
  const dec = new TextDecoder()
  const p = await sandbox.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) }, timeoutMs: 60_000 })
  const send = (s) => sandbox.pty.sendInput(p.pid, new TextEncoder().encode(s))
  // Each wait looks at what came after the last one; markers are split
  // with "" so that the echo of what is typed does not match them.
  let seen = 0
  const expect = async (what, re) => {
    await waitFor(what, () => re.test(out.slice(seen)))
    const m = re.exec(out.slice(seen))
    seen += m.index + m[0].length
    return m
  }

  await send('tty | sed "s/^/tty=/"\n')
  await expect('tty naming /dev/pts/N', /tty=\/dev\/pts\/\d+/)
  await send(`python3 -c 'import os; print("name" + "=" + os.ttyname(0))'\n`)
  await expect('os.ttyname naming /dev/pts/N', /name=\/dev\/pts\/\d+/)

  await send('stty size | sed "s/^/size=/"\n')
  await expect('stty size 24 80', /size=24 80/)
  await sandbox.pty.resize(p.pid, { cols: 100, rows: 30 })
  await send('stty size | sed "s/^/size=/"\n')
  await expect('stty size 30 100 after resize', /size=30 100/)

  await send('sleep 100\n')
  await new Promise((r) => setTimeout(r, 500))
  await send('\x1a')
  await expect('^Z stopping sleep 100', /Stopped\s+sleep 100/)
  await send('jobs\n')
  await expect('jobs listing it stopped', /Stopped\s+sleep 100/)
  await send('fg\n')
  await new Promise((r) => setTimeout(r, 500))
  await send('\x03')
  await send('echo "st""atus=$?"\n')
  await expect('^C ending the foreground job', /status=130/)
  await send('echo "al""ive"\n')
  await expect('the shell living on', /alive/)

  await send('exit 4\n')
  const res = await p.wait().catch((e) => e)
  assert.equal(res.exitCode, 4, `exit status: ${JSON.stringify(res)}`)
})

await check('pty: a terminal lives through pause and resume, with its shell and its size', async () => {
  let out = ''
  const dec = new TextDecoder()
  const onData = (d) => { out += dec.decode(d, { stream: true }) }
  const p = await sandbox.pty.create({ cols: 90, rows: 20, onData, timeoutMs: 0 })
  await sandbox.pty.sendInput(p.pid, new TextEncoder().encode('MARK=kept-$((6*7)); echo "re""ady"\n'))
  await waitFor('the shell ready', () => out.includes('ready'))
  await p.disconnect()
  assert.equal(await sandbox.pause(), true)
  sandbox = await Sandbox.connect(sandbox.sandboxId, { requestTimeoutMs: 90_000 })
  out = ''
  const q = await sandbox.pty.connect(p.pid, { onData, timeoutMs: 0 })
  const send = (s) => sandbox.pty.sendInput(p.pid, new TextEncoder().encode(s))
  await send('echo "mark=$MARK size=$(stty size) tty=$(tty)"\n')
  await waitFor('the shell\'s variable, size and terminal after resume', () => /mark=kept-42 size=20 90 tty=\/dev\/pts\/\d+/.test(out))
  await sandbox.pty.resize(p.pid, { cols: 70, rows: 15 })
  await send('stty size | sed "s/^/size=/"\n')
  await waitFor('a resize after resume', () => /size=15 70/.test(out))
  await send('exit 6\n')
  const res = await q.wait().catch((e) => e)
  assert.equal(res.exitCode, 6, `exit status: ${JSON.stringify(res)}`)
}, { timeoutMs: 150_000 })

await killAll([sandbox])
done()
