// The SDK's Template builder against `hutch serve --build-allow`: its
// aptInstall, pipInstall and npmInstall steps install from the test's
// package mirror (HUTCH_MIRROR, over HTTPS with a CA only the host
// trusts), the one destination the build allow list names; a step that
// reaches for another fails the build with its log.

import { BuildError, Sandbox, Template } from 'e2b'
import { assert, check, done, killAll, rejects } from './lib.mjs'

const mirror = process.env.HUTCH_MIRROR
const name = `netbuilt-${process.pid}`
const created = []

await check(
  'aptInstall, pipInstall and npmInstall install from the allowed mirror',
  async (note) => {
    const logs = []
    const tpl = Template()
      .fromBaseImage()
      .setEnvs({
        PIP_INDEX_URL: `${mirror}/simple`,
        NPM_CONFIG_REGISTRY: `${mirror}/npm/`,
        NPM_CONFIG_AUDIT: 'false',
        NPM_CONFIG_FUND: 'false',
      })
      .runCmd(
        `rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && echo "deb [trusted=yes] ${mirror}/apt ./" > /etc/apt/sources.list.d/mirror.list`,
        { user: 'root' },
      )
      .aptInstall('hutch-demo')
      .pipInstall('hutchdemo')
      .npmInstall('hutch-demo', { g: true })
    const info = await Template.build(tpl, name, { onBuildLogs: (e) => logs.push(e.message) }).catch((err) => {
      throw new Error(`${err.message}\n${logs.slice(-40).join('\n')}`)
    })
    note(`build ${info.buildId}, ${logs.length} log entries`)
    const sb = await Sandbox.create(name, { timeoutMs: 120_000 })
    created.push(sb)
    const r = await sb.commands.run(
      `cat /usr/share/hutch-demo/origin; python3 -c 'import hutchdemo; print(hutchdemo.VALUE)'; NODE_PATH=$(npm root -g) node -e 'console.log(require("hutch-demo"))'`,
    )
    assert.equal(r.stdout, 'apt-from-the-test-repository\nfrom-the-test-index\nnpm-from-the-test-registry\n')
  },
  { timeoutMs: 900_000 },
)

await check(
  'a step reaching a host the list does not name fails the build with its log',
  async () => {
    const logs = []
    const tpl = Template().fromBaseImage().runCmd('curl -sS -m 5 https://denied.test/')
    const err = await rejects(Template.build(tpl, `${name}-denied`, { onBuildLogs: (e) => logs.push(e.message) }), 'a build reaching denied.test')
    assert.ok(err instanceof BuildError, `got ${err}`)
    const text = logs.join('\n')
    assert.match(text, /Could not resolve host: denied\.test/, `the step's error is not in the logs:\n${text.slice(-2000)}`)
    assert.equal(await Template.exists(`${name}-denied`), false)
  },
  { timeoutMs: 300_000 },
)

await killAll(created)
done()
