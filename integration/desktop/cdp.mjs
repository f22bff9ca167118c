// Playwright and Puppeteer against the DevTools URL `hutch browser ID`
// printed (CDP_URL): a page served inside the sandbox (PAGE_URL, whose
// title is PAGE_TITLE), a host its policy allows (ALLOWED_URLS) and
// hosts it denies (DENIED_URLS, space-separated), which must not load.
// Run by TestBrowserCDP with HUTCH_NO_SERVE=1.

import { check, done } from '../e2b/lib.mjs'
import { playwrightChecks, puppeteerChecks, refusedWithoutToken } from './cdp-lib.mjs'

const cdpUrl = process.env.CDP_URL
const split = (v) => (v || '').split(' ').filter(Boolean)
const pages = {
  pageUrl: process.env.PAGE_URL,
  title: process.env.PAGE_TITLE,
  allowedUrls: split(process.env.ALLOWED_URLS),
  deniedUrls: split(process.env.DENIED_URLS),
}

await check('Playwright connectOverCDP: a page in the sandbox, an allowed host, and denied hosts fail', async (note) => {
  for (const n of await playwrightChecks(cdpUrl, pages)) note(n)
}, { timeoutMs: 120_000 })

await check('Puppeteer connect: the same page', async (note) => {
  for (const n of await puppeteerChecks(cdpUrl, pages)) note(n)
}, { timeoutMs: 120_000 })

await check('the URL without its token, or with another, opens nothing', async () => {
  await refusedWithoutToken(cdpUrl)
})

done()
