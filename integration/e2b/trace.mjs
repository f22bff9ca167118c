// One sandbox's life through the SDK, for the tracing test: create,
// one commands.run that exits 3, kill. It prints the sandbox's ID on a
// KEEP line for the Go test to find its spans.
import { Sandbox, CommandExitError } from 'e2b'
import { check, done, assert, runID } from './lib.mjs'

let keep = {}
await check('a sandbox is created, runs one command and is killed', async () => {
  const sandbox = await Sandbox.create('base', { metadata: { suite: 'trace', run: runID } })
  let res
  try {
    res = await sandbox.commands.run('echo traced-output; exit 3')
  } catch (err) {
    if (!(err instanceof CommandExitError)) throw err
    res = err
  }
  assert.equal(res.exitCode, 3)
  assert.equal(res.stdout, 'traced-output\n')
  keep = { sandboxId: sandbox.sandboxId }
  await sandbox.kill()
})
console.log(`KEEP ${JSON.stringify(keep)}`)
done()
