// Template tags through the SDK against `hutch serve`: a build named
// NAME:TAG with more tags gets them all; Template.getTags lists them with
// their build; assignTags points a new tag at a build and
// Sandbox.create('NAME:TAG') starts that build; removeTags removes them.
// Another tenant (E2B_API_KEY_OTHER) sees no tags and cannot use them.

import { Sandbox, Template, TemplateError } from 'e2b'
import { assert, check, done, killAll, rejects } from './lib.mjs'

const name = `tagged-${process.pid}`
const other = { apiKey: process.env.E2B_API_KEY_OTHER }
const created = []
let v1, v2

await check(
  'Template.build(NAME:TAG, {tags}) tags the build with each',
  async (note) => {
    v1 = await Template.build(Template().fromBaseImage().runCmd('echo one > /home/user/version'), `${name}:v1`, { tags: ['stable'] })
    v2 = await Template.build(Template().fromBaseImage().runCmd('echo two > /home/user/version'), `${name}:v2`)
    note(`builds ${v1.buildId} and ${v2.buildId}`)
    const tags = await Template.getTags(name)
    assert.deepEqual(tags.map((t) => t.tag), ['stable', 'v1', 'v2'])
    for (const t of tags) {
      assert.equal(t.buildId, t.tag === 'v2' ? v2.buildId : v1.buildId, `tag ${t.tag}`)
      assert.ok(t.createdAt instanceof Date && Math.abs(Date.now() - t.createdAt.getTime()) < 3_600_000, `tag ${t.tag} created ${t.createdAt}`)
    }
    assert.equal(await Template.exists(name), true)
  },
  { fatal: true, timeoutMs: 600_000 },
)

await check('assignTags points a tag at a build; Sandbox.create(NAME:TAG) starts it', async () => {
  const info = await Template.assignTags(`${name}:v2`, ['prod', 'latest'])
  assert.equal(info.buildId, v2.buildId)
  assert.deepEqual(info.tags, ['prod', 'latest'])
  for (const [ref, want] of [[`${name}:prod`, 'two'], [`${name}:stable`, 'one'], [name, 'two']]) {
    const sb = await Sandbox.create(ref, { timeoutMs: 120_000 })
    created.push(sb)
    const r = await sb.commands.run('cat /home/user/version')
    assert.equal(r.stdout.trim(), want, `a sandbox of ${ref}`)
  }
  // Moving a tag moves what it starts.
  await Template.assignTags(`${name}:v1`, 'prod')
  const sb = await Sandbox.create(`${name}:prod`, { timeoutMs: 120_000 })
  created.push(sb)
  assert.equal((await sb.commands.run('cat /home/user/version')).stdout.trim(), 'one')
}, { timeoutMs: 300_000 })

await check('GET /templates lists the template once, as its latest build', async () => {
  const res = await fetch(`${process.env.E2B_API_URL}/templates`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.equal(res.status, 200)
  const mine = (await res.json()).filter((t) => t.templateID === name || t.templateID.startsWith(`${name}:`))
  assert.deepEqual(mine.map((t) => [t.templateID, t.buildID]), [[name, v2.buildId]])
})

await check('removeTags removes the tags and nothing else', async () => {
  await Template.removeTags(name, ['stable', 'prod'])
  assert.deepEqual((await Template.getTags(name)).map((t) => t.tag), ['latest', 'v1', 'v2'])
  await rejects(Sandbox.create(`${name}:stable`), 'a create of a removed tag')
  const err = await rejects(Template.removeTags(name, 'no-such-tag'), 'removing a tag the template does not have')
  assert.ok(err instanceof TemplateError, `got ${err}`)
  assert.deepEqual((await Template.getTags(name)).map((t) => t.tag), ['latest', 'v1', 'v2'], 'a failed removal removed something')
})

await check('bad tags and targets are refused with what is wrong', async () => {
  let err = await rejects(Template.assignTags(`${name}:nope`, 'x'), 'tagging from a tag that does not exist')
  assert.match(err.message, /not found/)
  err = await rejects(Template.assignTags(`${name}:v1`, 'bad tag!'), 'a tag with a space')
  assert.match(err.message, /is not a tag/)
})

await check('another tenant sees no tags and cannot use them', async () => {
  await rejects(Template.getTags(name, other), 'another tenant listing the tags')
  await rejects(Template.assignTags(`${name}:v1`, 'mine', other), 'another tenant tagging the build')
  await rejects(Template.removeTags(name, 'v1', other), 'another tenant removing a tag')
  await rejects(Sandbox.create(`${name}:v1`, other), 'another tenant creating from a tag')
  assert.deepEqual((await Template.getTags(name)).map((t) => t.tag), ['latest', 'v1', 'v2'])
})

await killAll(created)
done()
