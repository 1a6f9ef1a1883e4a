// webui_browser.mjs - drives the chat page (GET /) in headless Chromium through puppeteer-core,
// against a running `gptoss serve` with an API key (test_webui.sh starts it):
//
//   node webui_browser.mjs URL API_KEY ARTIFACT_DIR
//
// Checks, in order: the key prompt on a 401 and the model name once the key is saved; a first
// turn whose answer is seen growing while it streams, with the settings (system message,
// reasoning effort, sampling, max tokens) in the request; a second turn whose request carries
// the first; Stop during a long generation (the page is usable again and the next request
// carries the partial answer); a 401 from the chat endpoint (a wrong key) asks for the key and
// resends; a 400 shown readably; and, with a crafted stream answered by request interception,
// reasoning shown apart and foldable, HTML in the model's output shown as text without running,
// a javascript: link defused, and a fenced code block highlighted. Screenshots go to
// ARTIFACT_DIR. Exits 1 on the first failed check, naming it.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import puppeteer from 'puppeteer-core';

const [url, apiKey, artifacts] = process.argv.slice(2);
if (!url || !apiKey || !artifacts) {
  console.error('usage: node webui_browser.mjs URL API_KEY ARTIFACT_DIR');
  process.exit(2);
}
mkdirSync(artifacts, { recursive: true });
const chromium = process.env.CHROMIUM || '/usr/bin/chromium';
const slow = process.env.GPTOSS_SANITIZE === '1' ? 6 : 1;
const T = (ms) => ms * slow;

let step = 'start';
function check(condition, what) {
  if (!condition) throw new Error(what);
}

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--no-first-run',
         '--disable-dev-shm-usage', '--disable-extensions', '--window-size=1200,900'],
});
let page;
let failed = false;
try {
  page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 900 });
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));
  page.on('console', (m) => {
    // Refused requests (the 401s and the 400 this test provokes) are logged by the browser.
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) pageErrors.push(m.text());
  });
  const chatRequests = []; // bodies of POST /v1/chat/completions, in order
  page.on('request', (r) => {
    if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions'))
      chatRequests.push(JSON.parse(r.postData()));
  });
  const state = () => page.$$eval('.msg.assistant', (all) => all.map((m) => m.dataset.state));
  async function lastAssistant(f) { // f(the last assistant message element), in the page
    const handle = await page.evaluateHandle(() => {
      const all = document.querySelectorAll('.msg.assistant');
      return all[all.length - 1];
    });
    try { return await handle.evaluate(f); } finally { await handle.dispose(); }
  }
  async function waitDone(what, timeout) {
    await page.waitForFunction(() => {
      const all = document.querySelectorAll('.msg.assistant');
      const m = all[all.length - 1];
      return m && m.dataset.state !== 'streaming';
    }, { timeout: T(timeout), polling: 100 }).catch(() => { throw new Error(`${what}: never finished`); });
  }
  async function typeAndSend(text) {
    await page.click('#input');
    await page.$eval('#input', (e) => { e.value = ''; });
    await page.type('#input', text);
    await page.keyboard.press('Enter');
  }
  async function setField(id, value) {
    await page.$eval(id, (e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }, value);
  }

  // ---- the page, the key prompt, the model ----
  step = 'load';
  const response = await page.goto(url, { waitUntil: 'load', timeout: T(15000) });
  check(response.status() === 200, `GET / answered ${response.status()}`);
  check(response.headers()['content-type'] === 'text/html; charset=utf-8',
        `GET / content-type ${response.headers()['content-type']}`);
  check(/script-src 'sha256-/.test(response.headers()['content-security-policy'] || ''),
        'GET / has no Content-Security-Policy with the script hash');
  step = 'key prompt';
  await page.waitForSelector('#key-dialog[open]', { timeout: T(10000) })
    .catch(() => { throw new Error('no API key prompt after /v1/models answered 401'); });
  await page.screenshot({ path: join(artifacts, 'webui-key-prompt.png') });
  await page.type('#key-input', apiKey);
  await page.click('#key-save');
  await page.waitForFunction(() => document.getElementById('model').textContent === 'tiny',
                             { timeout: T(10000) })
    .catch(async () => { throw new Error(`model name not shown: "${await page.$eval('#model', (e) => e.textContent)}"`); });
  check(await page.evaluate(() => localStorage.getItem('gptoss.api_key')) === apiKey,
        'the API key is not kept in localStorage');
  check(!(await page.$('#key-dialog[open]')), 'the key dialog stayed open');

  // ---- turn 1: settings in the request, the answer seen while it streams ----
  step = 'turn 1';
  await setField('#system', 'You are a test.');
  await page.select('#effort', 'high');
  await setField('#temperature', '0.7');
  await setField('#top-p', '0.9');
  await setField('#max-tokens', '400'); // long enough to be seen streaming
  await typeAndSend('Hello there');
  await page.waitForFunction(() => {
    const m = document.querySelector('.msg.assistant');
    return m && m.dataset.state === 'streaming' && m.querySelector('.answer').textContent.length > 0;
  }, { timeout: T(20000), polling: 'mutation' })
    .catch(() => { throw new Error('no answer text appeared while streaming'); });
  check(await page.$eval('#stop', (e) => !e.hidden), 'Stop is not shown while generating');
  await waitDone('turn 1', 30000);
  const first = await lastAssistant((m) => ({ state: m.dataset.state, finish: m.dataset.finish,
    answer: m.querySelector('.answer').textContent, meta: m.querySelector('.meta').textContent,
    reasoningHidden: m.querySelector('details.reasoning').hidden }));
  check(first.state === 'done', `turn 1 ended as ${first.state}: ${await page.$eval('#error-text', (e) => e.textContent)}`);
  check(first.finish === 'length', `turn 1 finish ${first.finish}, expected length (max_tokens 400)`);
  check(/\b400 tokens/.test(first.meta), `turn 1 meta does not count 400 tokens: "${first.meta}"`);
  check(first.answer.trim().length > 0, 'turn 1 answer is empty');
  check(first.reasoningHidden, 'a reasoning section is shown though the server sent no reasoning');
  check(chatRequests.length === 1, `${chatRequests.length} chat requests after turn 1`);
  const r1 = chatRequests[0];
  check(r1.stream === true && r1.model === 'tiny' && r1.reasoning_effort === 'high' &&
        r1.temperature === 0.7 && r1.top_p === 0.9 && r1.max_tokens === 400,
        `turn 1 request settings: ${JSON.stringify({ ...r1, messages: undefined })}`);
  check(JSON.stringify(r1.messages) === JSON.stringify([
    { role: 'system', content: 'You are a test.' }, { role: 'user', content: 'Hello there' }]),
        `turn 1 messages: ${JSON.stringify(r1.messages)}`);

  // ---- turn 2: the request carries turn 1 ----
  step = 'turn 2';
  await typeAndSend('And a second question');
  await waitDone('turn 2', 30000);
  check((await state()).join() === 'done,done', `states after turn 2: ${await state()}`);
  const r2 = chatRequests[1];
  check(r2 && r2.messages.length === 4, `turn 2 request has ${r2 && r2.messages.length} messages`);
  check(r2.messages[1].content === 'Hello there' && r2.messages[2].role === 'assistant' &&
        r2.messages[2].content.length > 0 && r2.messages[3].content === 'And a second question',
        `turn 2 messages: ${JSON.stringify(r2.messages).slice(0, 300)}`);
  await page.screenshot({ path: join(artifacts, 'webui-two-turns.png') });

  // ---- Stop during a long generation ----
  step = 'stop';
  await setField('#max-tokens', '6000'); // with the prompt, within the tiny model's 8192
  await typeAndSend('Write a long story');
  await page.waitForFunction(() => {
    const all = document.querySelectorAll('.msg.assistant');
    const m = all[all.length - 1];
    return m.dataset.state === 'streaming' && m.querySelector('.answer').textContent.length > 0;
  }, { timeout: T(20000), polling: 100 });
  const stopAt = Date.now();
  await page.click('#stop');
  await waitDone('stop', 5000);
  const stopped = await lastAssistant((m) => ({ state: m.dataset.state,
    meta: m.querySelector('.meta').textContent, answer: m.querySelector('.answer').textContent }));
  check(stopped.state === 'stopped', `after Stop the message is ${stopped.state}`);
  check(/stopped/.test(stopped.meta), `no "stopped" note: "${stopped.meta}"`);
  console.log(`stop: the stream ended ${Date.now() - stopAt} ms after the click`);
  check(await page.$eval('#send', (e) => !e.hidden && !e.disabled), 'Send is not usable after Stop');
  check(await page.$eval('#stop', (e) => e.hidden), 'Stop still shown after Stop');
  await page.screenshot({ path: join(artifacts, 'webui-stopped.png') });
  await setField('#max-tokens', '8');
  await typeAndSend('Shorter, please');
  await waitDone('turn after stop', 30000);
  check((await state()).join() === 'done,done,stopped,done', `states after Stop: ${await state()}`);
  const r4 = chatRequests[3];
  check(r4.messages.length === 8 && r4.messages[6].role === 'assistant' &&
        r4.messages[6].content.length > 0, `the request after Stop lacks the partial answer: ${
    JSON.stringify(r4.messages.map((m) => [m.role, m.content.length]))}`);

  // ---- a wrong key: the chat request's 401 asks for the key, then resends ----
  step = 'chat 401';
  await page.evaluate(() => localStorage.setItem('gptoss.api_key', 'wrong-key'));
  await typeAndSend('With a wrong key');
  await page.waitForSelector('#key-dialog[open]', { timeout: T(10000) })
    .catch(() => { throw new Error('no key prompt after the chat endpoint answered 401'); });
  check(await page.$eval('#input', (e) => e.value) === 'With a wrong key',
        'the refused message was not given back to the input box');
  await page.$eval('#key-input', (e) => { e.value = ''; });
  await page.type('#key-input', apiKey);
  await page.click('#key-save');
  await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 5,
                             { timeout: T(10000) });
  await waitDone('resent turn', 30000);
  check((await state()).join() === 'done,done,stopped,done,done', `states after the resend: ${await state()}`);
  const resent = chatRequests[chatRequests.length - 1];
  check(resent.messages[resent.messages.length - 1].content === 'With a wrong key' &&
        resent.messages.length === 10, 'the resent request is not the refused one');

  // ---- an error from the server, shown readably ----
  step = 'error';
  await setField('#temperature', '7');
  await typeAndSend('Too hot');
  await page.waitForSelector('#error:not([hidden])', { timeout: T(10000) })
    .catch(() => { throw new Error('no error shown for temperature 7'); });
  const errorText = await page.$eval('#error-text', (e) => e.textContent);
  check(/^HTTP 400 .*temperature/.test(errorText), `error text: "${errorText}"`);
  check(await page.$eval('#input', (e) => e.value) === 'Too hot', 'the failed message was not given back');
  check((await state()).length === 5, 'the failed turn left a message behind');
  await page.screenshot({ path: join(artifacts, 'webui-error.png') });
  await setField('#temperature', '1');

  // ---- a crafted stream: reasoning, HTML injection, a link, a code block ----
  step = 'crafted stream';
  await page.click('#new-chat');
  check((await state()).length === 0, 'New chat left messages');
  const chunk = (delta, finish = null) => 'data: ' + JSON.stringify({
    id: 'x', object: 'chat.completion.chunk', created: 0, model: 'tiny',
    choices: [{ index: 0, delta, finish_reason: finish }] }) + '\n\n';
  const injected = 'Look: <img src=x onerror="window.__pwned=1"> and <script>window.__pwned=2</script>' +
    ' and <b onmouseover="window.__pwned=4">bold</b>\n\n[a link](javascript:window.__pwned=3)\n\n' +
    '<iframe src="javascript:parent.__pwned=5"></iframe>\n\n' +
    '```python\ndef add(x):\n    return x + 1\n```\n\nDone with **markdown**.';
  const stream = chunk({ role: 'assistant', content: '' }) +
    chunk({ reasoning_content: 'Thinking about <img src=x onerror="window.__pwned=6"> ' }) +
    chunk({ reasoning_content: 'the answer.' }) +
    injected.match(/[\s\S]{1,17}/g).map((piece) => chunk({ content: piece })).join('') +
    chunk({}, 'stop') + 'data: [DONE]\n\n';
  await page.setRequestInterception(true);
  page.on('request', (r) => {
    if (r.isInterceptResolutionHandled()) return;
    if (r.method() === 'POST' && r.url().endsWith('/v1/chat/completions'))
      r.respond({ status: 200, contentType: 'text/event-stream', body: stream });
    else
      r.continue();
  });
  await typeAndSend('Show me something');
  await waitDone('crafted stream', 10000);
  await new Promise((resolve) => setTimeout(resolve, 500)); // an image's onerror would fire by now
  const got = await lastAssistant((m) => {
    const a = m.querySelector('.answer');
    const link = [...a.querySelectorAll('a')].find((e) => e.textContent === 'a link');
    const code = a.querySelector('pre code');
    return {
      state: m.dataset.state, text: a.textContent, html: a.innerHTML,
      elements: [...m.querySelectorAll('img, script, iframe, [onerror], [onmouseover]')].map((e) => e.outerHTML),
      linkHref: link ? link.getAttribute('href') : '(no link)',
      codeClass: code ? code.className : '(no code)',
      keyword: code ? [...code.querySelectorAll('.hljs-keyword')].map((e) => e.textContent).join() : '',
      strong: [...a.querySelectorAll('strong')].map((e) => e.textContent).join(),
      reasoningHidden: m.querySelector('details.reasoning').hidden,
      reasoningOpen: m.querySelector('details.reasoning').open,
      reasoning: m.querySelector('.reasoning-text').textContent,
      summary: m.querySelector('details.reasoning summary').textContent,
    };
  });
  check(got.state === 'done', `crafted stream ended as ${got.state}`);
  check(await page.evaluate(() => window.__pwned) === undefined,
        `model output ran script: window.__pwned = ${await page.evaluate(() => window.__pwned)}`);
  check(got.elements.length === 0, `live elements from model output: ${got.elements.join(' ')}`);
  for (const literal of ['<img src=x onerror="window.__pwned=1">', '<script>window.__pwned=2</script>',
                         '<b onmouseover="window.__pwned=4">'])
    check(got.text.includes(literal), `"${literal}" is not shown as text: ${got.text.slice(0, 300)}`);
  check(got.linkHref === null, `the javascript: link kept href=${got.linkHref}`);
  check(/\bhljs\b/.test(got.codeClass) && /language-python/.test(got.codeClass),
        `code block classes: "${got.codeClass}"`);
  check(/\bdef\b/.test(got.keyword) && /\breturn\b/.test(got.keyword), `highlighted keywords: "${got.keyword}"`);
  check(got.strong === 'markdown', `**markdown** rendered as "${got.strong}"`);
  check(!got.reasoningHidden && got.reasoning ===
        'Thinking about <img src=x onerror="window.__pwned=6"> the answer.', `reasoning: "${got.reasoning}"`);
  check(got.summary === 'Reasoning', `reasoning summary "${got.summary}"`);
  check(!got.reasoningOpen, 'the reasoning did not fold away once the answer began');
  await page.click('.msg.assistant details.reasoning summary');
  check(await page.$eval('.msg.assistant details.reasoning', (e) => e.open), 'a click does not open the reasoning');
  await page.screenshot({ path: join(artifacts, 'webui-rendering.png') });
  await page.click('.msg.assistant details.reasoning summary');
  check(!(await page.$eval('.msg.assistant details.reasoning', (e) => e.open)), 'a second click does not fold the reasoning');

  step = 'page errors';
  check(pageErrors.length === 0, `errors in the page: ${pageErrors.join(' | ')}`);
  console.log('webui_browser: all checks passed');
} catch (e) {
  failed = true;
  console.error(`FAIL (${step}): ${e.message}`);
  if (page) await page.screenshot({ path: join(artifacts, 'webui-failure.png') }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
