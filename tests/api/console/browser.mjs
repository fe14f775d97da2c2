// Drives the ops console in Debian's headless Chromium with playwright-core,
// as an operator would: a refused login, a login, every page, the CSV
// export, a forged post, and an approval clicked through. Prints one JSON
// object of what the pages showed; the Rust test (tests/api/console.rs)
// asserts it against GetUsage and the agent turn, this script only reports
// and fails on anything it cannot do (a page that does not load, a control
// that is missing).
//
// Environment: AIO_CONSOLE (http://127.0.0.1:PORT), AIO_ADMIN_KEY,
// AIO_CALLER_KEY, AIO_TEAM, AIO_APPROVAL (the pending approval's ID),
// AIO_PLAYWRIGHT (the package's folder), AIO_CHROMIUM, AIO_SHOTS (where
// screenshots go, under target/).

import { createRequire } from 'node:module';
import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const require = createRequire(import.meta.url);
const { chromium } = require(process.env.AIO_PLAYWRIGHT);

const BASE = process.env.AIO_CONSOLE;
const TEAM = process.env.AIO_TEAM;
const APPROVAL = process.env.AIO_APPROVAL;
const SHOTS = process.env.AIO_SHOTS;
mkdirSync(SHOTS, { recursive: true });

const profile = mkdtempSync(join(tmpdir(), 'aio-console-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.AIO_CHROMIUM,
  headless: true,
  args: [
    '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
const report = {};
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const text = async (selector) => (await page.locator(selector).first().innerText()).trim();
  const shot = (name) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });

  // Signed out: the console sends the browser to the login form.
  await page.goto(`${BASE}/console`);
  report.signed_out_at = new URL(page.url()).pathname;

  // A caller key is refused.
  await page.fill('#key', process.env.AIO_CALLER_KEY);
  const [refused] = await Promise.all([
    page.waitForResponse((r) => r.url().endsWith('/console/login') && r.request().method() === 'POST'),
    page.click('button[type=submit]'),
  ]);
  report.refused_status = refused.status();
  report.refused_text = await text('#login-error');
  await shot('login-refused');

  // The admin key signs in and lands on the overview.
  await page.fill('#key', process.env.AIO_ADMIN_KEY);
  await Promise.all([page.waitForURL(`${BASE}/console`), page.click('button[type=submit]')]);
  report.cookie = (await context.cookies(`${BASE}/console`)).map((c) => ({
    name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path,
  }));

  // Keyboard: the first Tab reaches the skip link, which moves focus to the content.
  await page.keyboard.press('Tab');
  report.first_tab = await page.evaluate(() => document.activeElement.textContent.trim());
  await page.keyboard.press('Enter');
  report.after_skip = await page.evaluate(() => document.activeElement.id);

  const pages = {};
  const visit = async (name, path) => {
    const response = await page.goto(`${BASE}${path}`);
    const headings = await page.$$eval('h1, h2, h3', (hs) => hs.map((h) => h.tagName));
    const unlabelled = await page.$$eval('input:not([type=hidden]), select', (els) =>
      els.filter((el) => !el.labels || el.labels.length === 0).map((el) => el.name));
    pages[name] = {
      status: response.status(),
      h1: await text('h1'),
      current: await text('nav a[aria-current=page]'),
      headings,
      unlabelled,
    };
    await shot(name);
    return pages[name];
  };

  await visit('overview', '/console');
  Object.assign(pages.overview, {
    requests_month: await text('#requests-month'),
    spend_month: await text('#spend-month'),
    requests_today: await text('#requests-today'),
    chart_title: (await page.locator('#spend-per-day title').textContent()).trim(),
  });

  await visit('usage', `/console/usage?team=${TEAM}&by=task`);
  Object.assign(pages.usage, {
    requests: await text('#total-requests'),
    input_tokens: await text('#total-input-tokens'),
    output_tokens: await text('#total-output-tokens'),
    cost: await text('#total-cost'),
    bars: await page.locator('#usage-chart rect').count(),
  });
  const csvHref = await page.getAttribute('#csv', 'href');
  // The page's policy lets no script fetch: the download goes through the
  // browser context's own requests, with its cookies.
  report.csv = await (await page.request.get(`${BASE}${csvHref}`)).text();

  await visit('teams', '/console/teams');
  Object.assign(pages.teams, {
    monthly_requests_spent: await text(`table[data-team="${TEAM}"] tr[data-cap=monthly_requests] [data-field=spent]`),
    monthly_requests_limit: await text(`table[data-team="${TEAM}"] tr[data-cap=monthly_requests] [data-field=limit]`),
  });

  await visit('providers', '/console/providers');
  pages.providers.rows = await page.locator('#providers tbody tr').count();

  await visit('calls', `/console/calls?team=${TEAM}`);
  const firstTrace = page.locator('#recent-calls tbody tr a').first();
  await Promise.all([page.waitForURL(/trace=/), firstTrace.click()]);
  pages.calls.trace_attempts = await page.locator('table.attempts tbody tr').count();
  pages.calls.trace_cost = await text('#trace-cost');
  await shot('calls-trace');

  await visit('audit', `/console/audit?team=${TEAM}`);
  await Promise.all([page.waitForURL(/verify=1/), page.click('button[name=verify]')]);
  pages.audit.verified = await text('#verify-result');
  await shot('audit-verified');

  await visit('tools', `/console/tools?team=${TEAM}`);
  pages.tools.pending = await page.locator('section[data-approval]').count();

  // A forged post: this session's cookie goes along, but not its CSRF token.
  const forged = await page.request.post(`${BASE}/console/approvals/${APPROVAL}`, {
    form: { team: TEAM, decision: 'approve', csrf: '00'.repeat(32) },
    maxRedirects: 0,
  });
  report.forged_status = forged.status();
  await page.reload();
  report.pending_after_forgery = await page.locator('section[data-approval]').count();

  // Approve by a click.
  const held = page.locator(`section[data-approval="${APPROVAL}"]`);
  await held.locator('input[name=reason]').fill('looks right');
  await Promise.all([page.waitForURL(/decided=/), held.locator('button[value=approve]').click()]);
  report.decided = await text('#decided');
  report.pending_after_click = await page.locator('section[data-approval]').count();
  await shot('tools-approved');

  report.pages = pages;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
console.log(JSON.stringify(report));
