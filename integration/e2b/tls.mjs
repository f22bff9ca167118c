// The E2B SDK against `hutch serve` over TLS, set up as against E2B's
// cloud: only E2B_API_KEY and E2B_DOMAIN (no E2B_API_URL, no
// E2B_SANDBOX_URL), so every call goes to the SDK's own default URLs,
// https://api.DOMAIN and https://PORT-ID.DOMAIN, port 443. The Go test
// runs it in a network namespace whose resolver answers those names with
// the server's address, and trusts the test's CA (NODE_EXTRA_CA_CERTS).

import { Sandbox } from 'e2b'
import { assert, check, done, killAll, runID, waitFor } from './lib.mjs'

const domain = process.env.E2B_DOMAIN
const created = []

const sandbox = await check(
  'Sandbox.create at https://api.DOMAIN, its data plane at https://49983-ID.DOMAIN',
  async (note) => {
    const sb = await Sandbox.create({ metadata: { run: runID }, timeoutMs: 600_000 })
    created.push(sb)
    note(`envd at ${sb.envdApiUrl}`)
    assert.equal(sb.sandboxDomain, domain)
    assert.equal(sb.envdApiUrl, `https://49983-${sb.sandboxId}.${domain}`)
    return sb
  },
  { fatal: true, timeoutMs: 120_000 },
)

await check('commands.run over https', async () => {
  const r = await sandbox.commands.run('echo hello over tls; id -un')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello over tls\nuser\n')
})

await check('a command streams its output as it runs', async () => {
  const seen = []
  const r = await sandbox.commands.run('for i in 1 2 3; do echo tick $i; sleep 0.2; done', {
    onStdout: (d) => seen.push({ d, at: Date.now() }),
  })
  assert.equal(r.stdout, 'tick 1\ntick 2\ntick 3\n')
  assert.ok(seen.length >= 2, `output came in ${seen.length} piece(s), want it as it was printed`)
})

await check('files write, read and list over https', async () => {
  const bytes = new Uint8Array(300_000).map((_, i) => (i * 7) % 251)
  await sandbox.files.write('/home/user/tls/blob.bin', bytes)
  const back = await sandbox.files.read('/home/user/tls/blob.bin', { format: 'bytes' })
  assert.equal(back.length, bytes.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(bytes)), 'the file read back differs')
  const names = (await sandbox.files.list('/home/user/tls')).map((e) => e.name)
  assert.deepEqual(names, ['blob.bin'])
})

await check('getHost(port) fetched over https', async () => {
  await sandbox.files.write('/home/user/www/index.html', `hello from ${runID}\n`)
  await sandbox.commands.run('python3 -m http.server 8000 --bind 0.0.0.0 --directory /home/user/www', { background: true, timeoutMs: 0 })
  const host = sandbox.getHost(8000)
  assert.equal(host, `8000-${sandbox.sandboxId}.${domain}`)
  const body = await waitFor(
    `HTTP 200 from https://${host}`,
    async () => {
      const r = await fetch(`https://${host}/index.html`, { signal: AbortSignal.timeout(5_000) })
      return r.status === 200 ? r.text() : undefined
    },
    { timeoutMs: 20_000, intervalMs: 250 },
  )
  assert.equal(body, `hello from ${runID}\n`)
})

await check(
  'pause, then Sandbox.connect resumes it with its files',
  async () => {
    await sandbox.files.write('/home/user/kept.txt', 'kept across pause')
    assert.equal(await sandbox.pause(), true)
    assert.equal((await sandbox.getInfo()).state, 'paused')
    const resumed = await Sandbox.connect(sandbox.sandboxId, { requestTimeoutMs: 90_000 })
    assert.equal(await resumed.files.read('/home/user/kept.txt'), 'kept across pause')
    const r = await resumed.commands.run('echo awake')
    assert.equal(r.stdout, 'awake\n')
  },
  { timeoutMs: 180_000 },
)

await check('kill', async () => {
  assert.equal(await sandbox.kill(), true)
  created.length = 0
})

await killAll(created)
done()
