// A burst of creates through the E2B SDK against a server that makes
// fewer sandboxes at once than the burst asks for: every create succeeds,
// the SDK retrying by itself the ones the server answered 429 with
// Retry-After, and each new sandbox runs a command.
//
//   BURST_CREATES   creates at once (default 3)
import { Sandbox } from 'e2b'
import { check, done, assert, killAll, runID } from './lib.mjs'

const n = Number(process.env.BURST_CREATES || 3)
const made = []

await check(`${n} creates at once, each then runs a command`, async (note) => {
  const started = Date.now()
  const results = await Promise.allSettled(Array.from({ length: n }, async (_, i) => {
    const t0 = Date.now()
    const sbx = await Sandbox.create('base', { metadata: { run: runID }, timeoutMs: 120_000 })
    const ms = Date.now() - t0
    made.push(sbx)
    const r = await sbx.commands.run(`echo burst-${i}`)
    assert.equal(r.stdout, `burst-${i}\n`)
    return { id: sbx.sandboxId, ms }
  }))
  const failed = results.filter((r) => r.status === 'rejected').map((r) => String(r.reason))
  assert.deepEqual(failed, [], 'every create of the burst succeeds')
  note(`create times (ms): ${results.map((r) => r.value.ms).join(', ')}; all in ${Date.now() - started} ms`)
}, { timeoutMs: 120_000 })

await killAll(made)
done()
