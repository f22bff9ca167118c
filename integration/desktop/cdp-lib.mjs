// Playwright (playwright-core) and Puppeteer (puppeteer-core) against the
// DevTools URL hutch gives for a sandbox's Chromium: neither downloads a
// browser; both drive the one in the sandbox, through hutch's routing.

import { chromium } from 'playwright-core'
import puppeteer from 'puppeteer-core'
import assert from 'node:assert/strict'
import { pngSize } from './png.mjs'

const gotoTimeout = 15_000

// Opens url in a new page of browser (Playwright) and returns its title
// and a value its script computes.
async function playwrightPage(browser, url) {
  const context = browser.contexts()[0] ?? (await browser.newContext())
  const page = await context.newPage()
  try {
    await page.goto(url, { timeout: gotoTimeout })
    return { page, title: await page.title(), value: await page.evaluate(() => document.body.dataset.answer ?? String(6 * 7)) }
  } catch (err) {
    await page.close()
    throw err
  }
}

/**
 * Connects Playwright over CDP to cdpUrl, opens pageUrl (served inside
 * the sandbox), and checks its title, a script's value and a
 * screenshot; each of allowedUrls must show deniedMarker (what the test
 * hosts serve) and none of deniedUrls may. Returns notes.
 */
export async function playwrightChecks(cdpUrl, { pageUrl, title, deniedUrls = [], allowedUrls = [], deniedMarker = 'testhost' }) {
  const notes = []
  const t0 = Date.now()
  const browser = await chromium.connectOverCDP(cdpUrl, { timeout: 30_000 })
  notes.push(`Playwright connected over CDP in ${Date.now() - t0} ms to Chromium ${browser.version()}`)
  try {
    const { page, title: got, value } = await playwrightPage(browser, pageUrl)
    assert.equal(got, title)
    assert.equal(value, '42')
    const t1 = Date.now()
    const { result } = await (await page.context().newCDPSession(page)).send('Runtime.evaluate', { expression: '1 + 1', returnByValue: true })
    notes.push(`Runtime.evaluate round trip ${Date.now() - t1} ms`)
    assert.equal(result.value, 2)
    const png = await page.screenshot()
    const size = pngSize(png)
    assert.ok(size.width > 100 && size.height > 100, `screenshot ${JSON.stringify(size)}`)
    await page.close()
    for (const url of allowedUrls) {
      const p = await playwrightPage(browser, url)
      const text = await p.page.evaluate(() => document.body.innerText)
      assert.ok(text.includes(deniedMarker), `${url}, which the policy allows, shows ${JSON.stringify(text)}`)
      notes.push(`${url}: ${text.trim()}`)
      await p.page.close()
    }
    for (const url of deniedUrls) {
      // Refused: the load fails, or hutch's egress gateway answers
      // its refusal; never the test host's own page.
      let err, loaded
      try {
        const p = await playwrightPage(browser, url)
        loaded = await p.page.evaluate(() => document.body.innerText)
        await p.page.close()
      } catch (e) {
        err = e
      }
      assert.ok(err || !loaded.includes(deniedMarker), `${url} loaded, though the sandbox's policy denies it: ${loaded}`)
      notes.push(`${url}: ${err ? String(err.message).split('\n')[0] : loaded.trim()}`)
    }
  } finally {
    // Disconnects; the sandbox's browser runs on.
    await browser.close()
  }
  return notes
}

/**
 * The same with Puppeteer's connect({ browserWSEndpoint }).
 */
export async function puppeteerChecks(cdpUrl, { pageUrl, title }) {
  const notes = []
  const t0 = Date.now()
  const browser = await puppeteer.connect({ browserWSEndpoint: cdpUrl, protocolTimeout: 30_000 })
  notes.push(`Puppeteer connected in ${Date.now() - t0} ms to ${await browser.version()}`)
  try {
    const page = await browser.newPage()
    await page.goto(pageUrl, { timeout: gotoTimeout })
    assert.equal(await page.title(), title)
    assert.equal(await page.evaluate(() => document.body.dataset.answer ?? String(6 * 7)), '42')
    const png = Buffer.from(await page.screenshot())
    const size = pngSize(png)
    assert.ok(size.width > 100 && size.height > 100, `screenshot ${JSON.stringify(size)}`)
    await page.close()
  } finally {
    await browser.disconnect()
  }
  return notes
}

/** A DevTools URL without its token, or with another, is refused. */
export async function refusedWithoutToken(cdpUrl) {
  const u = new URL(cdpUrl)
  const param = [...u.searchParams.keys()][0]
  const bad = []
  u.searchParams.delete(param)
  bad.push(u.toString())
  u.searchParams.set(param, 'not-the-token')
  bad.push(u.toString())
  for (const url of bad) {
    const http = url.replace(/^ws/, 'http').replace('/devtools/browser', '/json/version')
    const res = await fetch(http)
    assert.ok(res.status === 403 || res.status === 404 || res.status === 502, `${http}: ${res.status}`)
    assert.ok(!(await res.text()).includes('webSocketDebuggerUrl'), `${http} answered DevTools`)
    let err
    try {
      const b = await chromium.connectOverCDP(url, { timeout: 10_000 })
      await b.close()
    } catch (e) {
      err = e
    }
    assert.ok(err, `${url} connected`)
  }
}
