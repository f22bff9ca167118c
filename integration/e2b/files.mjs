// The sandbox filesystem through the E2B SDK: sandbox.files write, read,
// list, exists, getInfo, rename, remove, makeDir, watchDir, and a 100 MiB
// upload and download checked by sha256 both ways.
import { randomBytes } from 'node:crypto'
import { Sandbox, FileType, FilesystemEventType, NotFoundError, CommandExitError } from 'e2b'
import { check, done, assert, waitFor, rejects, assertErrorClass, killAll, sha256, sha256Stream, runID } from './lib.mjs'

const dir = '/home/user/e2e'
let sandbox

await check(
  'create a sandbox from the base template',
  async () => {
    sandbox = await Sandbox.create('base', { timeoutMs: 600_000, metadata: { suite: 'files', run: runID }, requestTimeoutMs: 120_000 })
  },
  { fatal: true, timeoutMs: 150_000 },
)

await check('makeDir creates parents and answers false when the directory exists', async () => {
  assert.equal(await sandbox.files.makeDir(`${dir}/a/b`), true)
  assert.equal(await sandbox.files.makeDir(`${dir}/a/b`), false)
  const info = await sandbox.files.getInfo(`${dir}/a`)
  assert.equal(info.type, FileType.DIR)
  assert.equal(info.owner, 'user', 'a directory made as the default user belongs to user')
})

await check('write then read text, and the file is visible to commands', async () => {
  const w = await sandbox.files.write(`${dir}/hello.txt`, 'hello from the SDK\nline 2\n')
  assert.equal(w.path, `${dir}/hello.txt`)
  assert.equal(w.name, 'hello.txt')
  assert.equal(await sandbox.files.read(`${dir}/hello.txt`), 'hello from the SDK\nline 2\n')
  assert.equal((await sandbox.commands.run(`cat ${dir}/hello.txt`)).stdout, 'hello from the SDK\nline 2\n')
  await sandbox.files.write(`${dir}/hello.txt`, 'overwritten')
  assert.equal(await sandbox.files.read(`${dir}/hello.txt`), 'overwritten')
})

await check('write creates missing parent directories', async () => {
  await sandbox.files.write(`${dir}/deep/er/file.txt`, 'deep')
  assert.equal(await sandbox.files.read(`${dir}/deep/er/file.txt`), 'deep')
})

await check('write and read binary content byte for byte', async () => {
  const bytes = new Uint8Array(4096)
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 7) % 256
  await sandbox.files.write(`${dir}/bin.dat`, bytes.buffer)
  const back = await sandbox.files.read(`${dir}/bin.dat`, { format: 'bytes' })
  assert.equal(back.length, bytes.length)
  assert.equal(sha256(back), sha256(bytes))
  assert.equal((await sandbox.commands.run(`sha256sum < ${dir}/bin.dat`)).stdout.split(' ')[0], sha256(bytes))
})

await check('write several files at once', async () => {
  const infos = await sandbox.files.write([
    { path: `${dir}/multi/one.txt`, data: 'one' },
    { path: `${dir}/multi/two.txt`, data: 'two' },
  ])
  assert.equal(infos.length, 2)
  assert.equal(await sandbox.files.read(`${dir}/multi/two.txt`), 'two')
})

await check('exists and getInfo', async () => {
  assert.equal(await sandbox.files.exists(`${dir}/hello.txt`), true)
  assert.equal(await sandbox.files.exists(`${dir}/nope.txt`), false)
  const info = await sandbox.files.getInfo(`${dir}/hello.txt`)
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.path, `${dir}/hello.txt`)
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 'overwritten'.length)
  assert.equal(info.owner, 'user')
  assert.match(info.permissions, /^-rw/)
  assert.ok(info.modifiedTime instanceof Date && Math.abs(info.modifiedTime.getTime() - Date.now()) < 600_000, `modifiedTime ${info.modifiedTime}`)
  const err = await rejects(sandbox.files.getInfo(`${dir}/nope.txt`), 'getInfo of a missing file')
  assertErrorClass(err, NotFoundError, 'getInfo of a missing file')
})

await check('list a directory, and list with depth 2', async () => {
  const names = (await sandbox.files.list(dir)).map((e) => e.name).sort()
  for (const n of ['a', 'bin.dat', 'deep', 'hello.txt', 'multi']) assert.ok(names.includes(n), `list(${dir}) lacks ${n}: ${names}`)
  const a = (await sandbox.files.list(dir)).find((e) => e.name === 'a')
  assert.equal(a.type, FileType.DIR)
  const deep = (await sandbox.files.list(dir, { depth: 2 })).map((e) => e.path)
  assert.ok(deep.includes(`${dir}/a/b`), `list depth 2 lacks ${dir}/a/b: ${deep}`)
  assert.ok(!deep.includes(`${dir}/deep/er/file.txt`), 'list depth 2 must not go three levels down')
  const err = await rejects(sandbox.files.list(`${dir}/no-such-dir`), 'list of a missing directory')
  assertErrorClass(err, NotFoundError, 'list of a missing directory')
})

await check('rename moves a file and the old path is gone', async () => {
  const moved = await sandbox.files.rename(`${dir}/hello.txt`, `${dir}/a/renamed.txt`)
  assert.equal(moved.path, `${dir}/a/renamed.txt`)
  assert.equal(moved.name, 'renamed.txt')
  assert.equal(await sandbox.files.exists(`${dir}/hello.txt`), false)
  assert.equal(await sandbox.files.read(`${dir}/a/renamed.txt`), 'overwritten')
})

await check('remove a file and a directory tree; reading a removed file is FileNotFound', async () => {
  await sandbox.files.remove(`${dir}/a/renamed.txt`)
  assert.equal(await sandbox.files.exists(`${dir}/a/renamed.txt`), false)
  await sandbox.files.remove(`${dir}/deep`)
  assert.equal(await sandbox.files.exists(`${dir}/deep/er/file.txt`), false)
  const err = await rejects(sandbox.files.read(`${dir}/a/renamed.txt`), 'read of a removed file')
  assertErrorClass(err, NotFoundError, 'read of a removed file')
})

await check('files act as the default user unless told to act as root', async () => {
  const err = await rejects(sandbox.files.write('/root/by-user.txt', 'x'), 'write to /root as user')
  assert.ok(err instanceof Error)
  await sandbox.files.write('/root/by-root.txt', 'x', { user: 'root' })
  const info = await sandbox.files.getInfo('/root/by-root.txt', { user: 'root' })
  assert.equal(info.owner, 'root')
  const check = await rejects(sandbox.commands.run('cat /root/by-root.txt'), 'user reading /root')
  assertErrorClass(check, CommandExitError, 'user reading /root')
})

await check('watchDir reports create, write, rename and remove events', async (note) => {
  const wdir = `${dir}/watched`
  await sandbox.files.makeDir(wdir)
  const events = []
  const handle = await sandbox.files.watchDir(wdir, (e) => events.push(e), { timeoutMs: 60_000 })
  const has = (type, name) => events.some((e) => e.type === type && e.name === name)
  try {
    await sandbox.files.write(`${wdir}/new.txt`, 'first')
    await waitFor('a create event for new.txt', () => has(FilesystemEventType.CREATE, 'new.txt'), { timeoutMs: 10_000 })
    await sandbox.commands.run(`echo more >> ${wdir}/new.txt`)
    await waitFor('a write event for new.txt', () => has(FilesystemEventType.WRITE, 'new.txt'), { timeoutMs: 10_000 })
    await sandbox.files.rename(`${wdir}/new.txt`, `${wdir}/moved.txt`)
    await waitFor('a rename event for new.txt', () => has(FilesystemEventType.RENAME, 'new.txt'), { timeoutMs: 10_000 })
    await sandbox.files.remove(`${wdir}/moved.txt`)
    await waitFor('a remove event for moved.txt', () => has(FilesystemEventType.REMOVE, 'moved.txt'), { timeoutMs: 10_000 })
  } finally {
    note(`events: ${events.map((e) => `${e.type}:${e.name}`).join(', ')}`)
    await handle.stop()
  }
  const n = events.length
  await sandbox.files.write(`${wdir}/after-stop.txt`, 'x')
  await new Promise((r) => setTimeout(r, 1_000))
  assert.equal(events.length, n, 'events arrived after stop()')
})

await check('watchDir on a missing directory fails with NotFound', async () => {
  const err = await rejects(sandbox.files.watchDir(`${dir}/no-such-dir`, () => {}), 'watchDir of a missing directory')
  assertErrorClass(err, NotFoundError, 'watchDir of a missing directory')
})

const MiB = 1024 * 1024

await check(
  'upload 100 MiB: the sandbox holds the same sha256',
  async (note) => {
    const data = randomBytes(100 * MiB)
    const want = sha256(data)
    const t0 = Date.now()
    const info = await sandbox.files.write(`${dir}/big-up.bin`, new Blob([data]), { requestTimeoutMs: 180_000 })
    note(`upload took ${Date.now() - t0} ms`)
    assert.equal(info.path, `${dir}/big-up.bin`)
    const res = await sandbox.commands.run(`stat -c %s ${dir}/big-up.bin; sha256sum ${dir}/big-up.bin`, { timeoutMs: 120_000 })
    const [size, sum] = res.stdout.split('\n')
    assert.equal(Number(size), 100 * MiB)
    assert.equal(sum.split(' ')[0], want, 'the uploaded file differs from what was sent')
  },
  { timeoutMs: 240_000 },
)

await check(
  'download 100 MiB as a stream: the same sha256 as in the sandbox',
  async (note) => {
    await sandbox.commands.run(`head -c ${100 * MiB} /dev/urandom > ${dir}/big-down.bin`, { timeoutMs: 120_000 })
    const inside = (await sandbox.commands.run(`sha256sum ${dir}/big-down.bin`, { timeoutMs: 120_000 })).stdout.split(' ')[0]
    const t0 = Date.now()
    const stream = await sandbox.files.read(`${dir}/big-down.bin`, { format: 'stream', requestTimeoutMs: 180_000 })
    const { hash, size } = await sha256Stream(stream)
    note(`download took ${Date.now() - t0} ms`)
    assert.equal(size, 100 * MiB)
    assert.equal(hash, inside, 'the downloaded file differs from the one in the sandbox')
  },
  { timeoutMs: 240_000 },
)

await check('kill the sandbox', async () => {
  assert.equal(await sandbox.kill(), true)
  sandbox = undefined
})

await killAll([sandbox])
done()
