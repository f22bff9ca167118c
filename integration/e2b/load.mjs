// Load through the E2B SDK: many SDK clients at once, each with its own
// Sandbox.connect, run commands in a few sandboxes of the base template.
// Every command prints a line naming its client and number, a block of
// data derived from them, and a line on stderr; a few exit non-zero. Each
// client checks every byte of every output (as returned and as streamed to
// its callbacks) and the exit code. Then every sandbox is killed and the
// tenant lists none.
//
// Sizes come from the environment (the Go test sets them):
//   LOAD_SANDBOXES    sandboxes to create            (default 10)
//   LOAD_CLIENTS      clients per sandbox            (default 5)
//   LOAD_COMMANDS     commands per client            (default 100)
//   LOAD_PAYLOAD      bytes of data per command, at least (default 2048)
import { Sandbox, CommandExitError } from 'e2b'
import { check, done, assert, describe, sha256, killAll, runID } from './lib.mjs'

const envInt = (name, def) => {
  const v = process.env[name]
  if (v === undefined || v === '') return def
  const n = Number(v)
  if (!Number.isInteger(n) || n < 1 || n > 100_000) {
    console.error(`${name}=${v}: want an integer from 1 to 100000`)
    process.exit(2)
  }
  return n
}

const nSandboxes = envInt('LOAD_SANDBOXES', 10)
const clientsPer = envInt('LOAD_CLIENTS', 5)
const nCommands = envInt('LOAD_COMMANDS', 100)
const payload = envInt('LOAD_PAYLOAD', 2048)
// Every failExitEvery-th command of a client exits with failCode.
const failExitEvery = 10
const failCode = 3

/** What command i of client c prints: stdout, stderr and exit code. */
function expected(c, i) {
  const tag = `c${c}-${i}`
  const line = `${tag}\n`
  const lines = Math.ceil(payload / line.length)
  // Shell builtins only: the command's one process is bash itself.
  return {
    cmd: `printf '%s-%s\\n' c${c} ${i}; printf '${tag}\\n%.0s' {1..${lines}}; printf 'e-%s\\n' ${tag} >&2` +
      (i % failExitEvery === failExitEvery - 1 ? `; exit ${failCode}` : ''),
    stdout: line + line.repeat(lines),
    stderr: `e-${tag}\n`,
    exitCode: i % failExitEvery === failExitEvery - 1 ? failCode : 0,
  }
}

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)]
}

let sandboxes = []

await check(
  `create ${nSandboxes} sandboxes of the base template at once`,
  async (note) => {
    const t0 = Date.now()
    const made = await Promise.allSettled(
      Array.from({ length: nSandboxes }, () =>
        Sandbox.create('base', { timeoutMs: 600_000, metadata: { suite: 'load', run: runID }, requestTimeoutMs: 120_000 }),
      ),
    )
    sandboxes = made.filter((r) => r.status === 'fulfilled').map((r) => r.value)
    const failures = made.filter((r) => r.status === 'rejected').map((r) => describe(r.reason))
    note(`${sandboxes.length} sandboxes created in ${Date.now() - t0} ms`)
    assert.deepEqual(failures, [], `${failures.length} of ${nSandboxes} creates failed`)
    assert.equal(new Set(sandboxes.map((s) => s.sandboxId)).size, nSandboxes, 'create returned duplicate sandbox IDs')
  },
  { fatal: true, timeoutMs: 120_000 },
)

await check(
  `${nSandboxes * clientsPer} SDK clients (${clientsPer} a sandbox, each its own Sandbox.connect) run ${nCommands} commands each; every byte of every output is accounted for`,
  async (note) => {
    const failures = []
    const latencies = []
    let stdoutBytes = 0
    let commands = 0
    const t0 = Date.now()

    const client = async (c) => {
      const id = sandboxes[c % sandboxes.length].sandboxId
      let sandbox
      try {
        sandbox = await Sandbox.connect(id, { requestTimeoutMs: 60_000 })
      } catch (err) {
        failures.push(`client c${c}: Sandbox.connect(${id}): ${describe(err)}`)
        return
      }
      for (let i = 0; i < nCommands; i++) {
        const want = expected(c, i)
        const streamed = { stdout: [], stderr: [] }
        const started = Date.now()
        let res
        try {
          res = await sandbox.commands.run(want.cmd, {
            onStdout: (d) => streamed.stdout.push(d),
            onStderr: (d) => streamed.stderr.push(d),
            timeoutMs: 60_000,
            requestTimeoutMs: 60_000,
          })
        } catch (err) {
          if (err instanceof CommandExitError) {
            res = err
          } else {
            failures.push(`client c${c} command ${i} in ${id}: ${describe(err)}`)
            continue
          }
        }
        latencies.push(Date.now() - started)
        commands++
        stdoutBytes += res.stdout.length
        const problems = []
        if (res.exitCode !== want.exitCode) problems.push(`exit code ${res.exitCode}, want ${want.exitCode}`)
        if (res.stdout !== want.stdout) {
          problems.push(`stdout ${res.stdout.length} bytes sha256 ${sha256(res.stdout)}, want ${want.stdout.length} bytes sha256 ${sha256(want.stdout)}; starts ${JSON.stringify(res.stdout.slice(0, 40))}`)
        }
        if (res.stderr !== want.stderr) problems.push(`stderr ${JSON.stringify(res.stderr.slice(0, 80))}, want ${JSON.stringify(want.stderr)}`)
        if (streamed.stdout.join('') !== want.stdout) problems.push(`onStdout received ${streamed.stdout.join('').length} bytes that differ from the output`)
        if (streamed.stderr.join('') !== want.stderr) problems.push(`onStderr received ${JSON.stringify(streamed.stderr.join('').slice(0, 80))}`)
        if (problems.length > 0) failures.push(`client c${c} command ${i} in ${id} (${Date.now() - started} ms): ${problems.join('; ')}`)
      }
    }

    await Promise.all(Array.from({ length: sandboxes.length * clientsPer }, (_, c) => client(c)))
    const elapsed = Date.now() - t0
    latencies.sort((a, b) => a - b)
    note(
      `${commands} commands in ${elapsed} ms (${((commands * 1000) / elapsed).toFixed(1)}/s), ` +
        `${stdoutBytes} stdout bytes checked; round trip p50 ${percentile(latencies, 0.5)} ms, ` +
        `p99 ${percentile(latencies, 0.99)} ms, max ${latencies[latencies.length - 1]} ms`,
    )
    const want = sandboxes.length * clientsPer * nCommands
    assert.deepEqual(failures.slice(0, 10), [], `${failures.length} of ${want} commands failed (first 10 shown)`)
    assert.equal(commands, want, 'commands that ran')
  },
  { timeoutMs: 330_000 },
)

await check('kill every sandbox; the tenant lists none of them', async () => {
  const ids = sandboxes.map((s) => s.sandboxId)
  const killed = await Promise.all(sandboxes.map((s) => s.kill({ requestTimeoutMs: 60_000 })))
  assert.deepEqual(killed, ids.map(() => true), 'kill answered false for a sandbox it had created')
  sandboxes = []
  const p = Sandbox.list({ query: { metadata: { run: runID } } })
  const left = []
  for (let i = 0; p.hasNext && i < 20; i++) left.push(...(await p.nextItems()))
  assert.deepEqual(left.map((s) => s.sandboxId), [], 'sandboxes listed after every kill')
}, { timeoutMs: 60_000 })

await killAll(sandboxes)
done()
