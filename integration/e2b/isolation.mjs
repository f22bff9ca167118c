// Tenant isolation through the E2B SDK. E2B_API_KEY is tenant A's key,
// TENANT_B_KEY tenant B's (B may run one sandbox at a time). Tenant B must
// not see or touch A's sandbox or snapshot: every call answers exactly as it
// does for an ID that names nothing. A missing or wrong key is refused, and
// B's second sandbox is refused by its quota.
//
// The script leaves A's and B's sandboxes running and prints their IDs in
// a line `KEEP {...}`: the Go test checks the host's sandbox list against
// them and removes them.
import { Sandbox, AuthenticationError, SandboxNotFoundError, NotFoundError } from 'e2b'
import { check, done, assert, rejects, assertErrorClass, describe, unknownIDLike, runID, killAll } from './lib.mjs'

const keyA = process.env.E2B_API_KEY
const keyB = process.env.TENANT_B_KEY
if (!keyB) {
  console.error('TENANT_B_KEY is not set: run this script through the Go test')
  process.exit(2)
}
const asA = { apiKey: keyA }
const asB = { apiKey: keyB }

let sandboxA, sandboxB, snapA
let infoA // A's sandbox as A saw it before tenant B's attempts
let unknownID

const listAll = async (opts) => {
  const p = Sandbox.list(opts)
  const all = []
  for (let i = 0; p.hasNext && i < 20; i++) all.push(...(await p.nextItems()))
  return all
}

// outcome runs fn and describes what it did: a value, or an error's class
// and message with `id` replaced, so that two outcomes for two IDs compare.
async function outcome(fn, id) {
  const norm = (s) => String(s).split(id).join('<id>')
  try {
    const v = await fn(id)
    return { value: norm(JSON.stringify(v ?? null)) }
  } catch (err) {
    return { error: err.constructor.name, message: norm(err.message), statusCode: err.statusCode }
  }
}

// sameAsUnknown checks that fn on A's resource (as tenant B) is refused
// exactly as fn on a resource that does not exist, and that it was refused
// as not found.
async function sameAsUnknown(what, fn, aID, unknown, note) {
  const forA = await outcome(fn, aID)
  const forUnknown = await outcome(fn, unknown)
  note(`${what}: ${JSON.stringify(forA)}`)
  assert.deepEqual(forA, forUnknown, `${what}: tenant B on A's ID answered differently than on an unknown ID`)
  return forA
}

function assertNotFoundOutcome(what, o) {
  assert.ok(o.error, `${what}: tenant B succeeded on A's sandbox: ${o.value}`)
  assert.ok(['SandboxNotFoundError', 'NotFoundError', 'FileNotFoundError'].includes(o.error), `${what}: expected a not-found error, got ${o.error}: ${o.message}`)
}

await check(
  'tenant A creates a sandbox with a file and a snapshot; tenant B creates one sandbox',
  async () => {
    ;[sandboxA, sandboxB] = await Promise.all([
      Sandbox.create('base', { ...asA, timeoutMs: 600_000, metadata: { tenant: 'A', run: runID }, requestTimeoutMs: 120_000 }),
      Sandbox.create('base', { ...asB, timeoutMs: 600_000, metadata: { tenant: 'B', run: runID }, requestTimeoutMs: 120_000 }),
    ])
    await sandboxA.files.write('/home/user/secret.txt', 'tenant A only')
    snapA = (await sandboxA.createSnapshot({ requestTimeoutMs: 120_000 })).snapshotId
    assert.ok(snapA)
    infoA = await Sandbox.getInfo(sandboxA.sandboxId, asA)
    unknownID = unknownIDLike(sandboxA.sandboxId)
    assert.notEqual(unknownID, sandboxA.sandboxId)
    assert.notEqual(unknownID, sandboxB.sandboxId)
  },
  { fatal: true, timeoutMs: 240_000 },
)

await check('tenant B lists only its own sandbox, even filtering by A\'s metadata', async () => {
  assert.deepEqual((await listAll(asB)).map((s) => s.sandboxId), [sandboxB.sandboxId])
  assert.deepEqual(await listAll({ ...asB, query: { metadata: { tenant: 'A' } } }), [])
  assert.deepEqual((await listAll(asA)).map((s) => s.sandboxId), [sandboxA.sandboxId])
})

await check('tenant B cannot get info of A\'s sandbox (as if unknown)', async (note) => {
  const o = await sameAsUnknown('getInfo', (id) => Sandbox.getInfo(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(o.error, 'SandboxNotFoundError')
})

await check('tenant B cannot connect to A\'s sandbox (as if unknown)', async (note) => {
  const o = await sameAsUnknown('connect', (id) => Sandbox.connect(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(o.error, 'SandboxNotFoundError')
})

await check('tenant B cannot pause A\'s sandbox (as if unknown)', async (note) => {
  const o = await sameAsUnknown('pause', (id) => Sandbox.pause(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(o.error, 'SandboxNotFoundError')
})

await check('tenant B cannot fork A\'s sandbox (as if unknown)', async (note) => {
  const o = await sameAsUnknown('fork', (id) => Sandbox.fork(id, { ...asB, count: 1 }), sandboxA.sandboxId, unknownID, note)
  assert.equal(o.error, 'SandboxNotFoundError')
})

await check('tenant B cannot snapshot A\'s sandbox (as if unknown)', async (note) => {
  const o = await sameAsUnknown('createSnapshot', (id) => Sandbox.createSnapshot(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(o.error, 'SandboxNotFoundError')
})

await check('tenant B cannot kill, set the timeout of, or change the network of A\'s sandbox (as if unknown)', async (note) => {
  const k = await sameAsUnknown('kill', (id) => Sandbox.kill(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(k.value, 'false', 'kill of A\'s sandbox by B must answer false, as for an unknown ID')
  const t = await sameAsUnknown('setTimeout', (id) => Sandbox.setTimeout(id, 1_000, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(t.error, 'SandboxNotFoundError')
  const n = await sameAsUnknown('updateNetwork', (id) => Sandbox.updateNetwork(id, { denyOut: ['0.0.0.0/0'] }, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(n.error, 'SandboxNotFoundError')
  const m = await sameAsUnknown('getMetrics', (id) => Sandbox.getMetrics(id, asB), sandboxA.sandboxId, unknownID, note)
  assert.equal(m.error, 'SandboxNotFoundError')
})

// A handle on a sandbox that the caller did not get from create or connect:
// what a client that learned A's ID would build. With B's own sandbox's
// access token, or none.
function handleOn(id, token) {
  return new Sandbox({
    sandboxId: id,
    envdVersion: sandboxB.envdApi?.version ?? '0.5.0',
    envdAccessToken: token,
    apiKey: keyB,
    requestTimeoutMs: 15_000,
  })
}

for (const [label, token] of [
  ['without an access token', undefined],
  ['with the access token of its own sandbox', 'own'],
]) {
  await check(`tenant B cannot run commands in A's sandbox, ${label} (as if unknown)`, async (note) => {
    const tok = token === 'own' ? sandboxB.envdAccessToken : undefined
    const o = await sameAsUnknown('commands.run', (id) => handleOn(id, tok).commands.run('cat /home/user/secret.txt'), sandboxA.sandboxId, unknownID, note)
    assert.ok(o.error, `tenant B ran a command in A's sandbox: ${o.value}`)
    const l = await sameAsUnknown('commands.list', (id) => handleOn(id, tok).commands.list(), sandboxA.sandboxId, unknownID, note)
    assert.ok(l.error, `tenant B listed A's processes: ${l.value}`)
  })

  await check(`tenant B cannot read, list or write files of A's sandbox, ${label} (as if unknown)`, async (note) => {
    const tok = token === 'own' ? sandboxB.envdAccessToken : undefined
    const r = await sameAsUnknown('files.read', (id) => handleOn(id, tok).files.read('/home/user/secret.txt'), sandboxA.sandboxId, unknownID, note)
    assert.ok(r.error, `tenant B read A's file: ${r.value}`)
    const l = await sameAsUnknown('files.list', (id) => handleOn(id, tok).files.list('/home/user'), sandboxA.sandboxId, unknownID, note)
    assert.ok(l.error, `tenant B listed A's files: ${l.value}`)
    const w = await sameAsUnknown('files.write', (id) => handleOn(id, tok).files.write('/home/user/from-b.txt', 'B was here'), sandboxA.sandboxId, unknownID, note)
    assert.ok(w.error, `tenant B wrote into A's sandbox: ${w.value}`)
  })
}

await check('tenant B cannot create a sandbox from A\'s snapshot (as if unknown), nor see or delete it', async (note) => {
  const unknownSnap = `${unknownIDLike(snapA.split(':')[0])}${snapA.includes(':') ? snapA.slice(snapA.indexOf(':')) : ''}`
  const forA = await outcome((s) => Sandbox.create(s, { ...asB, requestTimeoutMs: 60_000 }), snapA)
  const forUnknown = await outcome((s) => Sandbox.create(s, { ...asB, requestTimeoutMs: 60_000 }), unknownSnap)
  note(`create from A's snapshot: ${JSON.stringify(forA)}; from an unknown one: ${JSON.stringify(forUnknown)}`)
  assert.ok(forA.error, `tenant B created a sandbox from A's snapshot: ${forA.value}`)
  assert.deepEqual({ ...forA, message: forA.message.split(snapA).join('<snap>') }, { ...forUnknown, message: forUnknown.message.split(unknownSnap).join('<snap>') })
  const p = Sandbox.listSnapshots(asB)
  const listed = []
  for (let i = 0; p.hasNext && i < 20; i++) listed.push(...(await p.nextItems()))
  assert.ok(!listed.some((s) => s.snapshotId === snapA), 'tenant B lists A\'s snapshot')
  assert.equal(await Sandbox.deleteSnapshot(snapA, asB), false, 'deleteSnapshot of A\'s snapshot by B must answer false, as for an unknown one')
})

await check('A\'s sandbox and snapshot are untouched by all of the above', async () => {
  const info = await Sandbox.getInfo(sandboxA.sandboxId, asA)
  assert.equal(info.state, 'running')
  assert.equal(info.endAt.getTime(), infoA.endAt.getTime(), 'B\'s setTimeout reached A\'s sandbox')
  assert.deepEqual(info.network, infoA.network, 'B\'s updateNetwork reached A\'s sandbox')
  assert.equal(await sandboxA.files.read('/home/user/secret.txt'), 'tenant A only')
  assert.equal(await sandboxA.files.exists('/home/user/from-b.txt'), false, 'B\'s write reached A\'s sandbox')
  const p = Sandbox.listSnapshots(asA)
  const listed = []
  for (let i = 0; p.hasNext && i < 20; i++) listed.push(...(await p.nextItems()))
  assert.ok(listed.some((s) => s.snapshotId === snapA), `A no longer lists its snapshot: ${JSON.stringify(listed)}`)
})

await check('a wrong API key is refused with AuthenticationError (401)', async () => {
  const wrong = { apiKey: 'e2b_0000000000000000000000000000000000000000' }
  for (const [what, fn] of [
    ['list', () => listAll(wrong)],
    ['getInfo', () => Sandbox.getInfo(sandboxA.sandboxId, wrong)],
    ['create', () => Sandbox.create('base', { ...wrong, requestTimeoutMs: 30_000 })],
    ['kill', () => Sandbox.kill(sandboxA.sandboxId, wrong)],
  ]) {
    const err = await rejects(fn(), `${what} with a wrong key`)
    assertErrorClass(err, AuthenticationError, `${what} with a wrong key`)
  }
  assert.equal((await Sandbox.getInfo(sandboxA.sandboxId, asA)).state, 'running')
})

await check('tenant B\'s second sandbox is refused by its quota, with a message naming it', async (note) => {
  const err = await rejects(Sandbox.create('base', { ...asB, requestTimeoutMs: 60_000 }), 'a second sandbox over --max-sandboxes 1')
  note(`refusal: ${describe(err)} (statusCode ${err.statusCode})`)
  assert.match(err.message, /sandbox/i, 'the message must name the sandbox quota')
  assert.match(err.message, /\b1\b/, 'the message must name the limit (1)')
  assert.deepEqual((await listAll(asB)).map((s) => s.sandboxId), [sandboxB.sandboxId], 'the refused create left a sandbox behind')
})

console.log(`KEEP ${JSON.stringify({ a: sandboxA?.sandboxId, b: sandboxB?.sandboxId, snapshot: snapA })}`)
if (process.env.HUTCH_E2E_KILL_AT_END) await killAll([sandboxA, sandboxB])
done()
