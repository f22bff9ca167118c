// The SDK's Template builder against `hutch serve`: a template built from
// code with each kind of step (a file and a directory copied from this
// client, commands as the image's user and as root, environment, working
// directory, user, and a start command with a ready check), its logs
// streamed, then sandboxes created from it with the start command already
// running. A failing step gives its log; another tenant can neither see
// nor use the template. E2B_API_KEY_OTHER is a second tenant's key.

import { mkdtempSync, mkdirSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { BuildError, Sandbox, Template, waitForPort } from 'e2b'
import { assert, check, done, killAll, rejects, runID } from './lib.mjs'

const ctx = mkdtempSync(path.join(tmpdir(), 'hutch-template-ctx-'))
writeFileSync(path.join(ctx, 'hello.txt'), `hello from the client ${runID}\n`)
mkdirSync(path.join(ctx, 'site', 'nested'), { recursive: true })
writeFileSync(path.join(ctx, 'site', 'index.html'), `served ${runID}\n`)
writeFileSync(path.join(ctx, 'site', 'nested', 'deep.txt'), 'deep\n')

const name = `built-${process.pid}`
const created = []

const logs = []
await check(
  'Template.build with every kind of step streams its logs and ends ready',
  async (note) => {
    const tpl = Template({ fileContextPath: ctx })
      .fromBaseImage()
      .copy('hello.txt', '/home/user/hello.txt')
      .copy('site', '/home/user/site')
      .runCmd('echo built-as-$(id -un) > /home/user/built.txt')
      .runCmd('mkdir -p /opt/tool && echo made-by-$(id -un) > /opt/tool/owner', { user: 'root' })
      .setEnvs({ GREETING: 'hi there', SECOND: 'two' })
      .setWorkdir('/home/user/site')
      .setUser('user')
      .setStartCmd('echo started >> /tmp/starts; exec python3 -m http.server 8000', waitForPort(8000))
    const info = await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e) })
    note(`build ${info.buildId}, ${logs.length} log entries`)
    assert.equal(info.templateId, name)
    const text = logs.map((e) => e.message).join('\n')
    assert.ok(text.includes('Uploaded'), `no upload in the logs:\n${text.slice(-2000)}`)
    assert.ok(/RUN .*built-as/.test(text), `the RUN step is not in the logs:\n${text.slice(-2000)}`)
    assert.equal(await Template.exists(name), true)
  },
  { fatal: true, timeoutMs: 600_000 },
)

await check(
  'Sandbox.create(name) starts with the start command running, the steps applied',
  async () => {
    for (let i = 0; i < 2; i++) {
      const sb = await Sandbox.create(name, { timeoutMs: 300_000 })
      created.push(sb)
      // No retry: the server listens from the first moment.
      const r = await sb.commands.run(
        'cat /home/user/hello.txt /home/user/built.txt /opt/tool/owner /home/user/site/nested/deep.txt; echo "$GREETING/$SECOND"; pwd; id -un; wc -l < /tmp/starts; curl -s http://127.0.0.1:8000/index.html',
      )
      assert.equal(
        r.stdout,
        `hello from the client ${runID}\nbuilt-as-user\nmade-by-root\ndeep\nhi there/two\n/home/user/site\nuser\n1\nserved ${runID}\n`,
      )
    }
    assert.notEqual(created[0].sandboxId, created[1].sandboxId)
  },
  { timeoutMs: 180_000 },
)

await check(
  'a failing step fails the build with its log',
  async () => {
    const failLogs = []
    const tpl = Template().fromBaseImage().runCmd('echo about to fail; exit 3')
    const err = await rejects(Template.build(tpl, `broken-${process.pid}`, { onBuildLogs: (e) => failLogs.push(e) }), 'a build whose step exits 3')
    assert.ok(err instanceof BuildError, `got ${err}`)
    const text = failLogs.map((e) => e.message).join('\n')
    assert.ok(text.includes('about to fail'), `the failing step's output is not in the logs:\n${text.slice(-2000)}`)
    assert.equal(await Template.exists(`broken-${process.pid}`), false, 'a failed build left a template')
  },
  { timeoutMs: 300_000 },
)

await check('another tenant can neither see nor use the template', async () => {
  const other = { apiKey: process.env.E2B_API_KEY_OTHER }
  assert.equal(await Template.exists(name, other), false)
  await rejects(Sandbox.create(name, other), 'another tenant creating from the template')
})

await killAll(created)
done()
