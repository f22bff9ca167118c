// E2B's volume content API through the SDK's Volume: files written,
// read, listed, changed and removed without a sandbox, seen by a sandbox
// that mounts the volume and the other way round. A link a sandbox plants
// in the volume leads nowhere out of it; a wrong token, and another
// tenant's token for a volume of the same ID, open nothing of this one.
// E2B_API_KEY is tenant A's key, TENANT_B_KEY tenant B's; the SDK reaches
// the content API at E2B_VOLUME_API_URL.
import { Sandbox, Volume, VolumePathNotFoundError } from 'e2b'
import { assert, assertErrorClass, check, done, killAll, rejects, runID } from './lib.mjs'

const asB = { apiKey: process.env.TENANT_B_KEY }
const name = `vc-${process.pid}`
let vol
let sandbox

await check(
  'write, read, list and stat files without a sandbox',
  async () => {
    vol = await Volume.create(name)
    assert.ok(vol.token, 'Volume.create gives a token')
    await vol.makeDir('/data/deep', { force: true })
    await vol.writeFile('/notes/a.txt', `hello volume ${runID}\n`, { force: true })
    const bytes = new Uint8Array(200_000).map((_, i) => (i * 13) % 251)
    await vol.writeFile('/data/blob.bin', bytes)
    assert.equal(await vol.readFile('/notes/a.txt'), `hello volume ${runID}\n`)
    const back = await vol.readFile('/data/blob.bin', { format: 'bytes' })
    assert.ok(Buffer.from(back).equals(Buffer.from(bytes)), 'the binary file read back differs')
    const top = (await vol.list('/')).map((e) => `${e.path}:${e.type}`)
    assert.deepEqual(top, ['/data:directory', '/notes:directory'])
    const deep = (await vol.list('/', { depth: 3 })).map((e) => e.path)
    assert.deepEqual(deep, ['/data', '/data/blob.bin', '/data/deep', '/notes', '/notes/a.txt'])
    const info = await vol.getInfo('/data/blob.bin')
    assert.equal(info.size, 200_000)
    assert.equal(info.type, 'file')
    const changed = await vol.updateMetadata('/notes/a.txt', { mode: 0o600 })
    assert.equal(changed.mode & 0o777, 0o600)
    assert.equal(await vol.exists('/nope'), false)
    assertErrorClass(await rejects(vol.readFile('/nope.txt'), 'reading a missing file'), VolumePathNotFoundError, 'a missing file')
  },
  { fatal: true },
)

await check(
  'a sandbox that mounts the volume sees those files, and the API sees its writes',
  async () => {
    sandbox = await Sandbox.create('base', { timeoutMs: 300_000, volumeMounts: { '/mnt/vol': vol } })
    const r = await sandbox.commands.run('cat /mnt/vol/notes/a.txt; echo from-the-sandbox > /mnt/vol/made.txt; ln -s /etc /mnt/vol/escape; ln -s /etc/passwd /mnt/vol/passwd', {
      user: 'root',
    })
    assert.equal(r.stdout, `hello volume ${runID}\n`)
    assert.equal(await vol.readFile('/made.txt'), 'from-the-sandbox\n')
    const link = await vol.getInfo('/escape')
    assert.equal(link.type, 'symlink')
    assert.equal(link.target, '/etc')
  },
  { timeoutMs: 180_000 },
)

await check('links planted in the volume lead nowhere out of it', async () => {
  for (const p of ['/escape/passwd', '/passwd', '/escape/hostname']) {
    const err = await rejects(vol.readFile(p), `reading ${p} through a planted link`)
    assert.ok(!String(err).includes('root:x:0:0'), `read the host's file through ${p}`)
  }
  await rejects(vol.writeFile('/escape/hutch-was-here', 'x'), 'writing through a planted link')
  await rejects(vol.makeDir('/escape/hutch-dir'), 'making a directory through a planted link')
  await rejects(vol.remove('/escape/hostname'), 'removing through a planted link')
  // Removing the link itself is fine: it is the volume's.
  await vol.remove('/escape')
  assert.equal(await vol.exists('/escape'), false)
})

await check("a wrong token, and another tenant's token for its volume of the same ID, open nothing of this one", async () => {
  const forged = new Volume(vol.volumeId, vol.name, vol.token.replace(/.$/, (c) => (c === '0' ? '1' : '0')))
  assertErrorClass(await rejects(forged.readFile('/notes/a.txt'), 'a forged token'), VolumePathNotFoundError, 'a forged token')
  const theirs = await Volume.create(name, asB)
  assert.equal(theirs.volumeId, vol.volumeId, 'tenant B names its volume the same')
  await theirs.writeFile('/b.txt', 'tenant b\n')
  assert.equal(await theirs.exists('/notes/a.txt'), false, "tenant B's token sees tenant A's files")
  assert.equal(await vol.exists('/b.txt'), false, "tenant A's token sees tenant B's files")
  const stolen = new Volume(vol.volumeId, vol.name, theirs.token)
  assert.equal(await stolen.exists('/notes/a.txt'), false)
  await Volume.destroy(theirs.volumeId, asB)
})

await check('remove a directory', async () => {
  await vol.remove('/data')
  assert.deepEqual((await vol.list('/')).map((e) => e.path).sort(), ['/made.txt', '/notes', '/passwd'])
})

await killAll([sandbox])
if (vol) {
  for (let i = 0; i < 20; i++) {
    try {
      if (await Volume.destroy(vol.volumeId)) break
    } catch {
      await new Promise((r) => setTimeout(r, 500))
    }
  }
}
done()
