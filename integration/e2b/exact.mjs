// Where the E2B SDK can tell `hutch serve` from E2B's cloud, it must not:
// each check is a branch a program written against E2B takes on the
// SDK's own answers (isRunning, its errors, signed URLs, files, lists,
// metrics). Run over TLS with only E2B_API_KEY and E2B_DOMAIN, as
// tls.mjs is, so that sandbox hosts are routed by name.

import { Sandbox, SandboxNotFoundError, TimeoutError } from 'e2b'
import { assert, check, done, describe, killAll, rejects, runID, unknownIDLike, waitFor } from './lib.mjs'

const domain = process.env.E2B_DOMAIN
const apiKey = process.env.E2B_API_KEY
const api = `https://api.${domain}`
const created = []

async function make(template, opts = {}) {
  const sb = await Sandbox.create(template, { metadata: { run: runID }, timeoutMs: 600_000, ...opts })
  created.push(sb)
  return sb
}

/** GET or POST of the control plane with the tenant's key: {status, body}. */
async function control(path) {
  const r = await fetch(`${api}${path}`, { headers: { 'X-API-Key': apiKey }, signal: AbortSignal.timeout(10_000) })
  return { status: r.status, body: await r.text() }
}

/** A request for envd of sandbox id by host name, with headers. */
async function envd(id, path, headers = {}) {
  const r = await fetch(`https://49983-${id}.${domain}${path}`, { headers, signal: AbortSignal.timeout(10_000) })
  return { status: r.status, body: await r.text() }
}

const main = await check('a sandbox of the base template', () => make('base'), { fatal: true, timeoutMs: 120_000 })

await check('isRunning() of a paused sandbox without auto-resume is false, and it stays paused', async () => {
  const sb = await make('base')
  assert.equal(await sb.isRunning(), true)
  assert.equal(await sb.pause(), true)
  assert.equal(await sb.isRunning(), false)
  // The SDK's own answers to E2B's 502: a command does not start, a
  // read times out.
  const err = await rejects(sb.commands.run('echo woken'), 'a command on the paused sandbox')
  assert.ok(err instanceof SandboxNotFoundError && /not running anymore/.test(err.message), `a command on a paused sandbox without auto-resume: ${describe(err)}`)
  const readErr = await rejects(sb.files.read('/etc/hostname'), 'a read of the paused sandbox')
  assert.ok(readErr instanceof TimeoutError, `a read of a paused sandbox without auto-resume: ${describe(readErr)}`)
  const info = await sb.getInfo()
  assert.equal(info.state, 'paused')
  assert.equal(info.lifecycle?.autoResume, false)
}, { timeoutMs: 120_000 })

await check('with auto-resume: isRunning() leaves it paused, a command resumes it', async () => {
  const sb = await make('base', { lifecycle: { onTimeout: 'pause', autoResume: true } })
  const before = await sb.getInfo()
  assert.deepEqual(before.lifecycle, { onTimeout: 'pause', autoResume: true })
  assert.equal(await sb.pause(), true)
  assert.equal(await sb.isRunning(), false)
  assert.equal((await sb.getInfo()).state, 'paused', 'the health check woke the sandbox')
  const r = await sb.commands.run('echo awake', { requestTimeoutMs: 90_000 })
  assert.equal(r.stdout, 'awake\n')
  assert.equal((await sb.getInfo()).state, 'running')
  assert.equal(await sb.isRunning(), true)
}, { timeoutMs: 180_000 })

await check("a command's stream when its sandbox is killed: the SDK's 'killed or reached its end of life'", async () => {
  const sb = await make('base')
  let started
  const seen = new Promise((resolve) => { started = resolve })
  const run = sb.commands.run('echo started; sleep 120', { onStdout: () => started(), timeoutMs: 0 })
  run.catch(() => {})
  await seen
  assert.equal(await Sandbox.kill(sb.sandboxId), true)
  const err = await rejects(run, 'the command of a killed sandbox')
  assert.ok(err instanceof TimeoutError && /killed or reached its end of life/.test(err.message), `got ${describe(err)}`)
  assert.equal(await sb.isRunning(), false)
  const readErr = await rejects(sb.files.read('/etc/hostname'), 'a read of a killed sandbox')
  assert.ok(readErr instanceof TimeoutError, `a read of a killed sandbox: ${describe(readErr)}, want TimeoutError`)
}, { timeoutMs: 120_000 })

await check('a killed sandbox and a wrong token answer the same 502 body, E2B\'s', async () => {
  const sb = await make('base')
  const gone = sb.sandboxId
  await sb.kill()
  const killed = await envd(gone, '/health', { 'X-Access-Token': main.envdAccessToken ?? 'x' })
  const wrong = await envd(main.sandboxId, '/health', { 'X-Access-Token': 'not-its-token' })
  assert.equal(killed.status, 502)
  assert.deepEqual(JSON.parse(killed.body), { sandboxId: gone, message: 'The sandbox was not found', code: 502 })
  assert.equal(wrong.status, 502)
  assert.equal(wrong.body, killed.body.replace(gone, main.sandboxId))
  const unknown = await envd(unknownIDLike(main.sandboxId), '/files?path=/etc/hostname')
  assert.equal(unknown.status, 502)
})

const secure = await check('signed download and upload URLs of a secure sandbox, by host name', async () => {
  const sb = await make('base', { secure: true })
  await sb.files.write('/home/user/signed.txt', `signed ${runID}`)
  const down = await sb.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 120 })
  assert.match(down, /signature=v1_/)
  const got = await fetch(down, { signal: AbortSignal.timeout(10_000) })
  assert.equal(got.status, 200, await got.clone().text())
  assert.equal(await got.text(), `signed ${runID}`)
  const up = await sb.uploadUrl('/home/user/up/new.txt', { useSignatureExpiration: 120 })
  const form = new FormData()
  form.append('file', new Blob([`uploaded ${runID}`]), 'new.txt')
  const put = await fetch(up, { method: 'POST', body: form, signal: AbortSignal.timeout(10_000) })
  assert.equal(put.status, 200, await put.clone().text())
  assert.equal(await sb.files.read('/home/user/up/new.txt'), `uploaded ${runID}`)
  const unexpiring = await sb.downloadUrl('/home/user/signed.txt')
  assert.equal((await fetch(unexpiring, { signal: AbortSignal.timeout(10_000) })).status, 200)
  return sb
})

await check('an expired, a changed and a misplaced signature are refused as envd refuses them', async () => {
  assert.ok(secure, 'no secure sandbox: the check before failed')
  const sb = secure
  const refused = async (url, method = 'GET') => {
    const r = await fetch(url, { method, signal: AbortSignal.timeout(10_000) })
    return { status: r.status, body: await r.json() }
  }
  const expired = await sb.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -10 })
  assert.deepEqual(await refused(expired), { status: 401, body: { code: 401, message: 'signature is already expired' } })
  const good = new URL(await sb.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 120 }))
  const changed = new URL(good)
  changed.searchParams.set('signature_expiration', String(Number(good.searchParams.get('signature_expiration')) + 3600))
  assert.deepEqual(await refused(changed), { status: 401, body: { code: 401, message: 'invalid signature' } })
  const otherPath = new URL(good)
  otherPath.searchParams.set('path', '/etc/shadow')
  assert.deepEqual(await refused(otherPath), { status: 401, body: { code: 401, message: 'invalid signature' } })
  // A read signature does not write.
  const asWrite = await refused(good, 'POST')
  assert.deepEqual(asWrite, { status: 401, body: { code: 401, message: 'invalid signature' } })
  // The same URL for a sandbox that is not there answers the same.
  const elsewhere = new URL(good)
  elsewhere.host = `49983-${unknownIDLike(sb.sandboxId)}.${domain}`
  assert.deepEqual(await refused(elsewhere), { status: 401, body: { code: 401, message: 'invalid signature' } })
})

await check('files.write into a new nested directory under / as the default user', async () => {
  const dir = `/exact-${process.pid}/a/b`
  const info = await main.files.write(`${dir}/f.txt`, 'nested')
  assert.equal(info.path, `${dir}/f.txt`)
  assert.equal(await main.files.read(`${dir}/f.txt`), 'nested')
  for (const d of [`/exact-${process.pid}`, `/exact-${process.pid}/a`, dir]) {
    const e = await main.files.getInfo(d)
    assert.equal(e.owner, 'user', `${d} is ${e.owner}'s, want the default user's`)
  }
  assert.equal((await main.files.getInfo(`${dir}/f.txt`)).owner, 'user')
  assert.equal((await main.files.getInfo('/')).owner, 'root', '/ was given away')
})

await check('file metadata: written with the file, read back by getInfo and list, replaced by the next write', async () => {
  const created = JSON.parse((await control(`/sandboxes/${main.sandboxId}`)).body)
  assert.equal(created.envdVersion, '0.6.4', 'the envd version reported')
  const dir = `/home/user/meta-${process.pid}`
  const w = await main.files.write(`${dir}/a.txt`, 'one', { metadata: { Owner: 'alice', purpose: 'report' } })
  assert.deepEqual(w.metadata, { owner: 'alice', purpose: 'report' })
  assert.deepEqual((await main.files.getInfo(`${dir}/a.txt`)).metadata, { owner: 'alice', purpose: 'report' })
  const listed = await main.files.list(dir)
  assert.deepEqual(listed.map((e) => [e.name, e.metadata]), [['a.txt', { owner: 'alice', purpose: 'report' }]])
  // Metadata set inside the sandbox is the same metadata.
  await main.commands.run(`python3 -c 'import os; os.setxattr("${dir}/a.txt", "user.e2b.reviewed", b"yes")'`)
  assert.deepEqual((await main.files.getInfo(`${dir}/a.txt`)).metadata, { owner: 'alice', purpose: 'report', reviewed: 'yes' })
  const again = await main.files.write(`${dir}/a.txt`, 'two', { metadata: { owner: 'bob' } })
  assert.deepEqual(again.metadata, { owner: 'bob' })
  assert.deepEqual((await main.files.getInfo(`${dir}/a.txt`)).metadata, { owner: 'bob' })
  await main.files.write(`${dir}/a.txt`, 'three')
  assert.equal((await main.files.getInfo(`${dir}/a.txt`)).metadata, undefined)
  const err = await rejects(main.files.write(`${dir}/b.txt`, 'x', { metadata: { k: 'x'.repeat(5000) } }), 'a write with 5000 bytes of metadata')
  assert.match(describe(err), /invalid metadata/)
  assert.equal(await main.files.exists(`${dir}/b.txt`), false, 'the refused write left its file')
})

await check('watchDir with includeEntry: each event carries the entry, metadata included', async () => {
  const dir = `/home/user/watch-${process.pid}`
  await main.files.makeDir(dir)
  const events = []
  const handle = await main.files.watchDir(dir, (e) => events.push(e), { includeEntry: true, allowNetworkMounts: true, timeoutMs: 60_000 })
  await main.files.write(`${dir}/w.txt`, 'watched', { metadata: { tag: 'seen' } })
  const ev = await waitFor('a write event with its entry', async () => events.find((e) => e.name === 'w.txt' && e.entry?.metadata?.tag === 'seen'), { timeoutMs: 20_000, intervalMs: 200 })
  await handle.stop()
  assert.equal(ev.entry.path, `${dir}/w.txt`)
  assert.equal(ev.entry.type, 'file')
  assert.equal(ev.entry.size, 7)
})

await check('list ordered, and filtered by start time and template', async () => {
  const other = await make('busybox')
  const ids = async (query, order) => {
    const p = Sandbox.list({ query: { metadata: { run: runID }, ...query }, order, limit: 100 })
    const out = []
    while (p.hasNext) out.push(...(await p.nextItems()))
    return out
  }
  const desc = await ids({ state: ['running'] })
  const asc = await ids({ state: ['running'] }, 'asc')
  assert.ok(desc.length >= 2, `listed ${desc.length}`)
  assert.deepEqual(asc.map((s) => s.sandboxId), desc.map((s) => s.sandboxId).reverse())
  for (let i = 1; i < asc.length; i++) assert.ok(asc[i - 1].startedAt <= asc[i].startedAt, 'asc is not oldest first')
  assert.deepEqual((await ids({ template: 'busybox' })).map((s) => s.sandboxId), [other.sandboxId])
  const newest = desc[0]
  const after = await ids({ startedAfter: newest.startedAt })
  assert.deepEqual(after.map((s) => s.sandboxId), [newest.sandboxId])
  const bad = await control('/v2/sandboxes?order=sideways')
  assert.equal(bad.status, 400)
  assert.match(JSON.parse(bad.body).message, /order "sideways"/)
  const unknown = await control('/v2/sandboxes?startedAround=now')
  assert.equal(unknown.status, 400)
  assert.match(JSON.parse(unknown.body).message, /startedAround/)
  await other.kill()
}, { timeoutMs: 120_000 })

await check('metrics over a window of the sandbox\'s history', async () => {
  const series = await waitFor(
    'three samples in three seconds',
    async () => {
      const m = await main.getMetrics()
      const secs = new Set(m.map((x) => Math.floor(x.timestamp.getTime() / 1000)))
      return secs.size >= 3 ? m : undefined
    },
    { timeoutMs: 20_000, intervalMs: 500 },
  )
  for (let i = 1; i < series.length; i++) assert.ok(series[i - 1].timestamp <= series[i].timestamp, 'not oldest first')
  const mid = series[Math.floor(series.length / 2)].timestamp
  const sec = new Date(Math.floor(mid.getTime() / 1000) * 1000)
  const win = await main.getMetrics({ start: sec, end: sec })
  assert.ok(win.length >= 1, 'the window of one sample is empty')
  for (const m of win) assert.equal(Math.floor(m.timestamp.getTime() / 1000), sec.getTime() / 1000)
  assert.ok(win.length < series.length, 'the window did not narrow the series')
  assert.ok(win.every((m) => m.memTotal > 0 && m.cpuCount >= 1))
  const bad = await control(`/sandboxes/${main.sandboxId}/metrics?start=yesterday`)
  assert.equal(bad.status, 400)
  assert.match(JSON.parse(bad.body).message, /start "yesterday"/)
}, { timeoutMs: 60_000 })

await killAll(created)
done()
