// A sandbox's life through the E2B SDK: getInfo, Sandbox.list with a
// metadata filter, getHost to a server inside, setTimeout, network update,
// pause and resume through Sandbox.connect, fork, snapshot and create from
// it, kill, and a timeout that ends a sandbox.
import { Sandbox, SandboxNotFoundError, InvalidArgumentError } from 'e2b'
import { check, done, assert, waitFor, rejects, assertErrorClass, killAll, requestByHost, runID, sleep, describe } from './lib.mjs'

let sandbox
let other
let forked
let fromSnap
let snapshotId

const listAll = async (opts) => {
  const p = Sandbox.list(opts)
  const all = []
  for (let i = 0; p.hasNext && i < 20; i++) all.push(...(await p.nextItems()))
  return all
}

await check(
  'create two sandboxes with metadata',
  async () => {
    ;[sandbox, other] = await Promise.all([
      Sandbox.create('base', { timeoutMs: 600_000, metadata: { suite: 'lifecycle', run: runID, role: 'main' }, requestTimeoutMs: 120_000 }),
      // A network link with all egress denied: a network update has
      // something to change, and nothing leaves the host.
      Sandbox.create('base', {
        timeoutMs: 600_000,
        metadata: { suite: 'lifecycle', run: runID, role: 'other' },
        network: { denyOut: ['0.0.0.0/0'] },
        requestTimeoutMs: 120_000,
      }),
    ])
    assert.notEqual(sandbox.sandboxId, other.sandboxId)
  },
  { fatal: true, timeoutMs: 150_000 },
)

await check('getInfo describes the sandbox', async () => {
  const info = await sandbox.getInfo()
  assert.equal(info.sandboxId, sandbox.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.deepEqual(info.metadata, { suite: 'lifecycle', run: runID, role: 'main' })
  assert.ok(info.startedAt <= new Date() && info.endAt > new Date(), `startedAt ${info.startedAt} endAt ${info.endAt}`)
  assert.ok(info.cpuCount > 0 && info.memoryMB > 0, `cpuCount ${info.cpuCount} memoryMB ${info.memoryMB}`)
  assert.equal(await sandbox.isRunning(), true)
})

await check('Sandbox.list filters by metadata', async () => {
  const mine = await listAll({ query: { metadata: { run: runID } } })
  assert.deepEqual(mine.map((s) => s.sandboxId).sort(), [sandbox.sandboxId, other.sandboxId].sort())
  const main = await listAll({ query: { metadata: { run: runID, role: 'main' } } })
  assert.deepEqual(main.map((s) => s.sandboxId), [sandbox.sandboxId])
  assert.deepEqual(main[0].metadata, { suite: 'lifecycle', run: runID, role: 'main' })
  const none = await listAll({ query: { metadata: { run: runID, role: 'no-such-role' } } })
  assert.deepEqual(none, [])
})

await check('Sandbox.list pages with limit', async () => {
  const p = Sandbox.list({ query: { metadata: { run: runID } }, limit: 1 })
  const first = await p.nextItems()
  assert.equal(first.length, 1)
  assert.equal(p.hasNext, true, 'a second page must be announced')
  const second = await p.nextItems()
  assert.equal(second.length, 1)
  assert.notEqual(first[0].sandboxId, second[0].sandboxId)
})

await check('getHost(port) reaches an HTTP server started in the sandbox', async (note) => {
  await sandbox.files.write('/home/user/www/index.html', `hello through getHost ${runID}\n`)
  await sandbox.commands.run('python3 -m http.server 8000 --bind 0.0.0.0 --directory /home/user/www', { background: true, timeoutMs: 0 })
  const host = sandbox.getHost(8000)
  assert.equal(host, `8000-${sandbox.sandboxId}.${process.env.E2B_DOMAIN}`)
  const res = await waitFor(
    `HTTP 200 from ${host}`,
    async () => {
      const r = await requestByHost(host, '/index.html')
      return r.status === 200 ? r : undefined
    },
    { timeoutMs: 20_000, intervalMs: 250 },
  )
  assert.equal(res.body, `hello through getHost ${runID}\n`)
  const closed = await requestByHost(sandbox.getHost(8001), '/')
  note(`a port nothing listens on answers ${closed.status}: ${closed.body.slice(0, 200)}`)
  assert.ok(closed.status >= 400, `a port nothing listens on answered ${closed.status}`)
  const unknown = await requestByHost(`8000-${sandbox.sandboxId}x.${process.env.E2B_DOMAIN}`, '/')
  assert.ok(unknown.status >= 400, `an unknown sandbox in Host answered ${unknown.status}`)
})

await check('setTimeout extends and shortens the sandbox end time', async () => {
  await sandbox.setTimeout(900_000)
  let end = (await sandbox.getInfo()).endAt.getTime()
  assert.ok(Math.abs(end - (Date.now() + 900_000)) < 30_000, `endAt ${new Date(end).toISOString()} is not about 15 minutes from now`)
  await sandbox.setTimeout(400_000)
  end = (await sandbox.getInfo()).endAt.getTime()
  assert.ok(Math.abs(end - (Date.now() + 400_000)) < 30_000, `endAt ${new Date(end).toISOString()} is not about 400 s from now`)
})

await check('updateNetwork sets allow and deny lists, and rejects a malformed one', async (note) => {
  const before = await other.getInfo()
  assert.deepEqual(before.network?.denyOut, ['0.0.0.0/0'], `network given at create: ${JSON.stringify(before.network)}`)
  await other.updateNetwork({ allowOut: ['1.1.1.1', '8.8.8.0/24'], denyOut: ['0.0.0.0/0'] })
  const info = await other.getInfo()
  note(`network after update: ${JSON.stringify(info.network)}`)
  assert.deepEqual(info.network?.allowOut, ['1.1.1.1', '8.8.8.0/24'])
  assert.deepEqual(info.network?.denyOut, ['0.0.0.0/0'])
  await other.updateNetwork({})
  const cleared = await other.getInfo()
  note(`network after an empty update: ${JSON.stringify(cleared.network)}`)
  assert.ok(!cleared.network?.allowOut?.length, `an empty update must clear the allow list: ${JSON.stringify(cleared.network)}`)
  await other.updateNetwork({ denyOut: ['0.0.0.0/0'] })
  assert.deepEqual((await other.getInfo()).network?.denyOut, ['0.0.0.0/0'])
  const err = await rejects(other.updateNetwork({ allowOut: ['not an address!'], denyOut: ['0.0.0.0/0'] }), 'a malformed allow entry')
  assert.ok(err.statusCode === 400 || err instanceof InvalidArgumentError, `malformed allow entry: want 400, got ${describe(err)}`)
  assert.match(err.message, /not an address!/, 'the error must name the bad entry')
  // A deny list narrower than everything: applied, or refused naming it.
  try {
    await other.updateNetwork({ denyOut: ['192.0.2.0/24'] })
    assert.deepEqual((await other.getInfo()).network?.denyOut, ['192.0.2.0/24'])
    note('a deny list of 192.0.2.0/24 is applied')
    await other.updateNetwork({ denyOut: ['0.0.0.0/0'] })
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e
    note(`a deny list of 192.0.2.0/24 is refused: ${e.message}`)
    assert.match(e.message, /192\.0\.2\.0\/24/, 'a refused deny entry must be named')
  }
  const after = (await other.getInfo()).network
  assert.deepEqual(after?.denyOut, ['0.0.0.0/0'], `a refused update must change nothing: ${JSON.stringify(after)}`)
  assert.ok(!after?.allowOut?.length, `a refused update must change nothing: ${JSON.stringify(after)}`)
  assert.equal((await other.commands.run('echo still here')).stdout, 'still here\n')
  const none = await rejects(sandbox.updateNetwork({ denyOut: ['0.0.0.0/0'] }), 'update of a sandbox created without network')
  note(`update of a sandbox without network: ${none.message}`)
})

let bgPid
await check(
  'pause: state paused, listed as paused',
  async () => {
    await sandbox.files.write('/home/user/before-pause.txt', 'kept across pause')
    const bg = await sandbox.commands.run('sleep 3600', { background: true, timeoutMs: 0 })
    bgPid = bg.pid
    await bg.disconnect()
    assert.equal(await sandbox.pause(), true)
    const info = await Sandbox.getInfo(sandbox.sandboxId)
    assert.equal(info.state, 'paused')
    const paused = await listAll({ query: { metadata: { run: runID }, state: ['paused'] } })
    assert.deepEqual(paused.map((s) => s.sandboxId), [sandbox.sandboxId])
    const running = await listAll({ query: { metadata: { run: runID }, state: ['running'] } })
    assert.deepEqual(running.map((s) => s.sandboxId), [other.sandboxId])
    assert.equal(await Sandbox.pause(sandbox.sandboxId), false, 'pausing a paused sandbox must answer false')
  },
  { timeoutMs: 90_000 },
)

await check(
  'Sandbox.connect resumes a paused sandbox with its files',
  async (note) => {
    const t0 = Date.now()
    const resumed = await Sandbox.connect(sandbox.sandboxId, { requestTimeoutMs: 90_000 })
    note(`connect (resume) took ${Date.now() - t0} ms`)
    assert.equal(resumed.sandboxId, sandbox.sandboxId)
    assert.equal((await Sandbox.getInfo(sandbox.sandboxId)).state, 'running')
    assert.equal(await resumed.files.read('/home/user/before-pause.txt'), 'kept across pause')
    assert.equal((await resumed.commands.run('echo resumed')).stdout, 'resumed\n')
  },
  { timeoutMs: 120_000 },
)

await check('a process started before pause still runs after resume', async (note) => {
  const procs = await sandbox.commands.list()
  note(`commands.list after resume: ${JSON.stringify(procs.map((p) => ({ pid: p.pid, cmd: [p.cmd, ...p.args].join(' ') })))}`)
  assert.ok(
    procs.some((p) => p.pid === bgPid && p.args.join(' ').includes('sleep 3600')),
    `pid ${bgPid} (sleep 3600, started before pause) is not listed after resume`,
  )
  const ps = await sandbox.commands.run('ps -eo args')
  assert.match(ps.stdout, /sleep 3600/, 'sleep 3600 does not run after resume')
})

await check(
  'fork: a running copy with the same files, independent of the original',
  async () => {
    await sandbox.files.write('/home/user/before-fork.txt', 'from the parent')
    const forks = await sandbox.fork({ count: 1, timeoutMs: 300_000, requestTimeoutMs: 120_000 })
    assert.equal(forks.length, 1)
    assert.ok(forks[0] instanceof Sandbox, `fork failed: ${forks[0]}`)
    forked = forks[0]
    assert.notEqual(forked.sandboxId, sandbox.sandboxId)
    assert.equal(await forked.files.read('/home/user/before-fork.txt'), 'from the parent')
    await forked.files.write('/home/user/before-fork.txt', 'changed in the fork')
    assert.equal(await sandbox.files.read('/home/user/before-fork.txt'), 'from the parent')
    assert.equal((await sandbox.getInfo()).state, 'running', 'the parent must keep running')
  },
  { timeoutMs: 150_000 },
)

await check(
  'setTimeout to a short time: the sandbox is gone when it expires',
  async () => {
    assert.ok(forked, 'needs the fork')
    await forked.setTimeout(2_000)
    await waitFor(
      `sandbox ${forked.sandboxId} to be gone after its timeout`,
      async () => {
        try {
          await Sandbox.getInfo(forked.sandboxId)
          return false
        } catch (err) {
          if (err instanceof SandboxNotFoundError) return true
          throw err
        }
      },
      { timeoutMs: 30_000, intervalMs: 500 },
    )
    forked = undefined
  },
  { timeoutMs: 45_000 },
)

await check(
  'createSnapshot, listSnapshots, then create a sandbox from the snapshot',
  async () => {
    await sandbox.files.write('/home/user/in-snapshot.txt', 'snapshotted')
    const snap = await sandbox.createSnapshot({ requestTimeoutMs: 120_000 })
    snapshotId = snap.snapshotId
    assert.ok(snapshotId, 'no snapshotId')
    const p = sandbox.listSnapshots()
    const listed = []
    for (let i = 0; p.hasNext && i < 20; i++) listed.push(...(await p.nextItems()))
    assert.ok(listed.some((s) => s.snapshotId === snapshotId), `listSnapshots lacks ${snapshotId}: ${JSON.stringify(listed)}`)
    assert.equal((await sandbox.getInfo()).state, 'running', 'the source must be running after the snapshot')
    fromSnap = await Sandbox.create(snapshotId, { timeoutMs: 300_000, requestTimeoutMs: 120_000 })
    assert.equal(await fromSnap.files.read('/home/user/in-snapshot.txt'), 'snapshotted')
    assert.equal((await fromSnap.commands.run('whoami')).stdout, 'user\n')
  },
  { timeoutMs: 240_000 },
)

await check('kill: the sandbox is gone, and a second kill answers false', async () => {
  assert.ok(fromSnap, 'needs the sandbox made from the snapshot')
  const id = fromSnap.sandboxId
  assert.equal(await fromSnap.kill(), true)
  fromSnap = undefined
  const err = await rejects(Sandbox.getInfo(id), 'getInfo of a killed sandbox')
  assertErrorClass(err, SandboxNotFoundError, 'getInfo of a killed sandbox')
  assert.equal(await Sandbox.kill(id), false)
  const err2 = await rejects(Sandbox.connect(id), 'connect to a killed sandbox')
  assertErrorClass(err2, SandboxNotFoundError, 'connect to a killed sandbox')
})

await check('deleteSnapshot removes the snapshot', async () => {
  assert.ok(snapshotId, 'needs the snapshot')
  assert.equal(await Sandbox.deleteSnapshot(snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snapshotId), false)
  const err = await rejects(Sandbox.create(snapshotId, { requestTimeoutMs: 60_000 }), 'create from a deleted snapshot')
  assert.ok(err instanceof Error)
  snapshotId = undefined
})

await check('kill the remaining sandboxes; none of this run is listed', async () => {
  assert.equal(await sandbox.kill(), true)
  assert.equal(await other.kill(), true)
  sandbox = other = undefined
  await sleep(0)
  assert.deepEqual(await listAll({ query: { metadata: { run: runID } } }), [])
})

await killAll([sandbox, other, forked, fromSnap])
if (snapshotId) await Sandbox.deleteSnapshot(snapshotId).catch(() => {})
done()
