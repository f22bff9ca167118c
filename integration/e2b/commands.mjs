// Commands and pseudo-terminals through the E2B SDK: sandbox.commands.run
// (streamed output, exit codes, envs, cwd, user, timeout), background
// commands (connect, stdin, kill) and sandbox.pty.
import { Sandbox, CommandExitError, TimeoutError } from 'e2b'
import { check, done, assert, sleep, waitFor, rejects, assertErrorClass, killAll, runID } from './lib.mjs'

let sandbox

await check(
  'create a sandbox from the base template with sandbox-wide envs',
  async () => {
    sandbox = await Sandbox.create('base', {
      timeoutMs: 600_000,
      envs: { HUTCH_E2E_SANDBOX_VAR: 'from-create' },
      metadata: { suite: 'commands', run: runID },
      requestTimeoutMs: 120_000,
    })
    assert.ok(sandbox.sandboxId, 'create returned no sandbox ID')
  },
  { fatal: true, timeoutMs: 150_000 },
)

await check('run streams stdout and stderr to the callbacks while the command runs', async (note) => {
  const events = []
  const t0 = Date.now()
  const res = await sandbox.commands.run('echo out1; echo err1 >&2; sleep 1; echo out2; echo err2 >&2', {
    onStdout: (d) => events.push({ stream: 'stdout', data: d, at: Date.now() - t0 }),
    onStderr: (d) => events.push({ stream: 'stderr', data: d, at: Date.now() - t0 }),
  })
  const ended = Date.now() - t0
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'out1\nout2\n')
  assert.equal(res.stderr, 'err1\nerr2\n')
  const joined = (s) => events.filter((e) => e.stream === s).map((e) => e.data).join('')
  assert.equal(joined('stdout'), 'out1\nout2\n', 'onStdout received other bytes than the result')
  assert.equal(joined('stderr'), 'err1\nerr2\n', 'onStderr received other bytes than the result')
  const first = events.find((e) => e.data.includes('out1'))
  assert.ok(first, 'no callback carried out1')
  assert.ok(first.at < ended - 500, `out1 arrived at ${first.at} ms, the command ended at ${ended} ms: output is not streamed`)
  note(`first output after ${first.at} ms, command done after ${ended} ms`)
})

await check('a failing command throws CommandExitError with its exit code and output', async () => {
  const err = await rejects(sandbox.commands.run('echo partial; echo bad >&2; exit 7'), 'exit 7')
  assertErrorClass(err, CommandExitError, 'exit 7')
  assert.equal(err.exitCode, 7)
  assert.equal(err.stdout, 'partial\n')
  assert.equal(err.stderr, 'bad\n')
  const notFound = await rejects(sandbox.commands.run('no-such-command-xyz'), 'unknown command')
  assertErrorClass(notFound, CommandExitError, 'unknown command')
  assert.equal(notFound.exitCode, 127)
  assert.match(notFound.stderr, /no-such-command-xyz/)
})

await check('envs: per-command variables, and the ones given at create', async () => {
  const res = await sandbox.commands.run('echo "$FOO|$BAR|$HUTCH_E2E_SANDBOX_VAR"', { envs: { FOO: 'bar baz', BAR: 'x=y' } })
  assert.equal(res.stdout, 'bar baz|x=y|from-create\n')
  const over = await sandbox.commands.run('echo "$HUTCH_E2E_SANDBOX_VAR"', { envs: { HUTCH_E2E_SANDBOX_VAR: 'overridden' } })
  assert.equal(over.stdout, 'overridden\n', 'a per-command env must override the sandbox-wide one')
})

await check('cwd: the home directory by default, the given directory otherwise', async () => {
  assert.equal((await sandbox.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sandbox.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  const err = await rejects(sandbox.commands.run('pwd', { cwd: '/no/such/dir' }), 'cwd that does not exist')
  assert.ok(err instanceof Error, 'a missing cwd must fail')
})

await check('user: "user" by default, "root" when asked', async () => {
  assert.equal((await sandbox.commands.run('whoami; id -u; echo $HOME')).stdout, 'user\n1000\n/home/user\n')
  assert.equal((await sandbox.commands.run('whoami; id -u; echo $HOME', { user: 'root' })).stdout, 'root\n0\n/root\n')
  const err = await rejects(sandbox.commands.run('touch /root/by-user'), 'user writing /root')
  assertErrorClass(err, CommandExitError, 'user writing /root')
  assert.match(err.stderr, /Permission denied/)
  await sandbox.commands.run('touch /root/by-root', { user: 'root' })
})

await check('timeoutMs ends a command that runs too long, and the command is stopped', async (note) => {
  const t0 = Date.now()
  const err = await rejects(sandbox.commands.run('sleep 47; echo finished', { timeoutMs: 1_500 }), 'sleep past timeoutMs')
  const took = Date.now() - t0
  assertErrorClass(err, TimeoutError, 'sleep past timeoutMs')
  assert.ok(took < 15_000, `the timeout took ${took} ms to fire`)
  note(`TimeoutError after ${took} ms`)
  await waitFor(
    'the timed-out sleep 47 to be gone from commands.list',
    async () => !(await sandbox.commands.list()).some((p) => p.args.join(' ').includes('sleep 47')),
    { timeoutMs: 10_000, intervalMs: 250 },
  )
})

await check('background command: list, connect from a second handle, sendStdin, kill', async () => {
  const first = []
  const h = await sandbox.commands.run('echo started; while read -r line; do echo "got:$line"; done', {
    background: true,
    stdin: true,
    onStdout: (d) => first.push(d),
    timeoutMs: 0,
  })
  assert.ok(Number.isInteger(h.pid) && h.pid > 0, `background handle has pid ${h.pid}`)
  await waitFor('"started" from the background command', () => first.join('').includes('started\n'))

  const listed = await sandbox.commands.list()
  const mine = listed.find((p) => p.pid === h.pid)
  assert.ok(mine, `commands.list does not show pid ${h.pid}: ${JSON.stringify(listed)}`)
  assert.equal(mine.cmd, '/bin/bash')

  const second = []
  const c = await sandbox.commands.connect(h.pid, { onStdout: (d) => second.push(d), timeoutMs: 0 })
  assert.equal(c.pid, h.pid)

  await sandbox.commands.sendStdin(h.pid, 'hello\n')
  await waitFor('got:hello on the first handle', () => first.join('').includes('got:hello\n'))
  await waitFor('got:hello on the connected handle', () => second.join('').includes('got:hello\n'))

  await h.sendStdin('again\n')
  await waitFor('got:again on the connected handle', () => second.join('').includes('got:again\n'))

  assert.equal(await sandbox.commands.kill(h.pid), true, 'kill of a running command must answer true')
  const waitErr = await rejects(c.wait(), 'wait on a killed command')
  assertErrorClass(waitErr, CommandExitError, 'wait on a killed command')
  await waitFor(
    `pid ${h.pid} to leave commands.list`,
    async () => !(await sandbox.commands.list()).some((p) => p.pid === h.pid),
    { timeoutMs: 10_000, intervalMs: 200 },
  )
  assert.equal(await sandbox.commands.kill(h.pid), false, 'kill of a finished command must answer false')
  await h.disconnect()
})

await check('background command: disconnect, then connect again and read later output', async () => {
  const h = await sandbox.commands.run('for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.5; done', {
    background: true,
  })
  await h.disconnect()
  const seen = []
  const c = await sandbox.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  const res = await c.wait()
  assert.equal(res.exitCode, 0)
  assert.match(seen.join(''), /tick6\n/, `connected handle missed later output: ${JSON.stringify(seen)}`)
})

await check('connect to a pid that does not exist fails', async () => {
  const err = await rejects(sandbox.commands.connect(999_999), 'connect to pid 999999')
  assert.ok(err instanceof Error)
})

await check('pty: create, read the prompt, stty size, resize, input, exit', async () => {
  let out = ''
  const dec = new TextDecoder()
  const p = await sandbox.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) }, timeoutMs: 60_000 })
  assert.ok(p.pid > 0)
  const send = (s) => sandbox.pty.sendInput(p.pid, new TextEncoder().encode(s))

  await send('stty size; echo "marker-$((6*7))"\n')
  await waitFor('stty size 24 80 in the pty output', () => /24 80\r?\n/.test(out) && out.includes('marker-42'))

  await sandbox.pty.resize(p.pid, { cols: 100, rows: 30 })
  await send('stty size\n')
  await waitFor('stty size 30 100 after resize', () => /30 100\r?\n/.test(out))

  await send('echo "term=$TERM user=$(whoami)"\n')
  await waitFor('TERM and user in the pty output', () => out.includes('term=xterm-256color user=user'))

  await send('exit 0\n')
  const res = await p.wait()
  assert.equal(res.exitCode, 0)
})

await check('pty: kill ends a running terminal', async () => {
  const p = await sandbox.pty.create({ cols: 40, rows: 10, onData: () => {}, timeoutMs: 60_000 })
  assert.equal(await sandbox.pty.kill(p.pid), true)
  const err = await rejects(p.wait(), 'wait on a killed pty')
  assert.ok(err instanceof Error)
})

await check('kill the sandbox', async () => {
  assert.equal(await sandbox.kill(), true)
  assert.equal(await Sandbox.kill(sandbox.sandboxId), false, 'killing it again must answer false')
  sandbox = undefined
})

await killAll([sandbox])
done()
