// Volumes through the E2B SDK. E2B_API_KEY is tenant A's key, TENANT_B_KEY
// tenant B's. A volume A creates is mounted by two of A's sandboxes (once
// as a Volume, once by name), which see each other's writes within a
// second; tenant B neither sees, mounts nor destroys it; destroying it is
// refused while sandboxes mount it, then done.
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, SandboxError } from 'e2b'
import { check, done, assert, rejects, assertErrorClass, waitFor, killAll, runID } from './lib.mjs'

const keyB = process.env.TENANT_B_KEY
if (!keyB) {
  console.error('TENANT_B_KEY is not set: run this script through the Go test')
  process.exit(2)
}
const asB = { apiKey: keyB }
const name = `vol-${process.pid}`
const opts = { timeoutMs: 600_000, metadata: { suite: 'volumes', run: runID }, requestTimeoutMs: 120_000 }

let vol
let sandboxes = []

await check(
  'Volume.create makes a volume listed by Volume.list and Volume.getInfo',
  async (note) => {
    vol = await Volume.create(name)
    note(`volumeId ${vol.volumeId}`)
    assert.equal(vol.name, name)
    assert.ok(vol.volumeId, 'a volumeId')
    const listed = await Volume.list()
    assert.deepEqual(listed.filter((v) => v.name === name), [{ volumeId: vol.volumeId, name }])
    const info = await Volume.getInfo(vol.volumeId)
    assert.equal(info.name, name)
    assert.equal(info.volumeId, vol.volumeId)
  },
  { fatal: true },
)

await check(
  'two sandboxes mount it, as a Volume and by name',
  async () => {
    sandboxes.push(await Sandbox.create('busybox', { ...opts, volumeMounts: { '/data': vol } }))
    sandboxes.push(await Sandbox.create('busybox', { ...opts, volumeMounts: { '/mnt/shared': name } }))
    const info = await Sandbox.getInfo(sandboxes[0].sandboxId)
    assert.deepEqual(info.volumeMounts, [{ name, path: '/data' }])
  },
  { fatal: true, timeoutMs: 150_000 },
)

await check('a write in one sandbox is read in the other within a second, both ways', async () => {
  const [one, two] = sandboxes
  await one.files.write('/data/greeting', 'from the first')
  await waitFor('the second sandbox to read the first one\'s write', async () => (await two.files.read('/mnt/shared/greeting')) === 'from the first', { timeoutMs: 1_000, intervalMs: 50 })
  await two.files.write('/mnt/shared/reply', 'from the second')
  await waitFor('the first sandbox to read the second one\'s write', async () => (await one.files.read('/data/reply')) === 'from the second', { timeoutMs: 1_000, intervalMs: 50 })
})

await check('another tenant does not see, mount or destroy it', async (note) => {
  assert.deepEqual((await Volume.list(asB)).filter((v) => v.name === name), [])
  assertErrorClass(await rejects(Volume.getInfo(vol.volumeId, asB), 'tenant B getInfo'), VolumeNotFoundError, 'tenant B getInfo')
  assert.equal(await Volume.destroy(vol.volumeId, asB), false, 'tenant B destroy answers not found')
  const err = await rejects(Sandbox.create('busybox', { ...opts, ...asB, volumeMounts: { '/data': name } }), 'tenant B mounting A\'s volume')
  note(`tenant B mounting it: ${err.message}`)
  assertErrorClass(err, SandboxError, 'tenant B mounting A\'s volume')
  assert.match(err.message, /^404: .*not found/)
  assert.equal(await sandboxes[0].files.read('/data/greeting'), 'from the first', 'A\'s volume is intact')
})

await check('destroy is refused while sandboxes mount the volume, then done', async (note) => {
  const err = await rejects(Volume.destroy(vol.volumeId), 'destroy of a volume in use')
  note(`destroy in use: ${err.message}`)
  assertErrorClass(err, VolumeError, 'destroy of a volume in use')
  assert.match(err.message, /^409: /)
  for (const sb of sandboxes) assert.ok(err.message.includes(sb.sandboxId), `the refusal names sandbox ${sb.sandboxId}`)
  await killAll(sandboxes)
  sandboxes = []
  assert.equal(await Volume.destroy(vol.volumeId), true)
  assertErrorClass(await rejects(Volume.getInfo(vol.volumeId), 'getInfo after destroy'), VolumeNotFoundError, 'getInfo after destroy')
  assert.equal(await Volume.destroy(vol.volumeId), false, 'a second destroy answers not found')
})

await killAll(sandboxes)
done()
