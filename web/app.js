// web/app.js - the chat page's logic. Talks only to the server that served it:
// GET /v1/models (the model's name) and POST /v1/chat/completions with stream: true, read as
// server-sent events from fetch's ReadableStream. Keeps the conversation in memory (every
// request carries all earlier turns) and the settings and API key in localStorage.
//
// Everything the model writes is untrusted: answers go through marked (raw HTML in them is
// shown as text), then DOMPurify, before reaching the page; reasoning is set as plain text.
(function () {
  'use strict';

  const $ = (id) => document.getElementById(id);
  const ui = {
    model: $('model'), messages: $('messages'), empty: $('empty'), input: $('input'),
    composer: $('composer'), send: $('send'), stop: $('stop'), newChat: $('new-chat'),
    settings: $('settings'), toggleSettings: $('toggle-settings'), system: $('system'),
    effort: $('effort'), temperature: $('temperature'), topP: $('top-p'),
    maxTokens: $('max-tokens'), keyState: $('key-state'), setKey: $('set-key'),
    error: $('error'), errorText: $('error-text'), errorClose: $('error-close'),
    keyDialog: $('key-dialog'), keyReason: $('key-reason'), keyInput: $('key-input'),
    keySave: $('key-save'), keyClear: $('key-clear'), keyCancel: $('key-cancel'),
  };

  // ---- storage (may be unavailable: private windows, file policies) ----
  const store = {
    get(name) { try { return localStorage.getItem('gptoss.' + name); } catch (e) { return null; } },
    set(name, value) {
      try {
        if (value === null || value === '') localStorage.removeItem('gptoss.' + name);
        else localStorage.setItem('gptoss.' + name, value);
      } catch (e) { /* settings then last only as long as the page */ }
    },
  };

  // ---- markdown: marked, then DOMPurify, then highlight.js on the code blocks ----
  const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) =>
    ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
  marked.use({
    gfm: true,
    renderer: {
      // Tags a model writes are meant as characters, not markup: show them as text.
      html(token) { return token.block ? '<p>' + escapeHtml(token.text) + '</p>' : escapeHtml(token.text); },
    },
  });
  DOMPurify.addHook('afterSanitizeAttributes', (node) => {
    if (node.tagName === 'A' && node.hasAttribute('href')) {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  });
  function renderMarkdown(element, text) {
    element.innerHTML = DOMPurify.sanitize(marked.parse(text, { async: false }));
    for (const code of element.querySelectorAll('pre code')) {
      const named = /\blanguage-(\S+)/.exec(code.className);
      if (named && !hljs.getLanguage(named[1])) {
        code.classList.remove(named[0]);
        code.classList.add('language-plaintext');
      }
      hljs.highlightElement(code);
    }
  }

  // ---- settings ----
  const fields = [['system', ui.system], ['effort', ui.effort], ['temperature', ui.temperature],
                  ['top_p', ui.topP], ['max_tokens', ui.maxTokens]];
  for (const [name, element] of fields) {
    const saved = store.get(name);
    if (saved !== null) element.value = saved;
    element.addEventListener('change', () => store.set(name, element.value));
  }
  function showKeyState() { ui.keyState.textContent = store.get('api_key') ? 'set' : 'none'; }
  showKeyState();
  ui.toggleSettings.addEventListener('click', () => {
    ui.settings.hidden = !ui.settings.hidden;
    ui.toggleSettings.setAttribute('aria-expanded', String(!ui.settings.hidden));
  });
  if (window.matchMedia('(max-width: 720px)').matches) {
    ui.settings.hidden = true;
    ui.toggleSettings.setAttribute('aria-expanded', 'false');
  }

  function number(element, name, integer) {
    const text = element.value.trim();
    if (text === '') return undefined;
    const value = Number(text);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value)))
      throw new Error(`${name}: "${text}" is not ${integer ? 'a whole number' : 'a number'}`);
    return value;
  }

  // ---- errors ----
  function showError(message) {
    ui.errorText.textContent = message;
    ui.error.hidden = false;
  }
  function clearError() { ui.error.hidden = true; ui.errorText.textContent = ''; }
  ui.errorClose.addEventListener('click', clearError);

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  // An OpenAI-style error body ({"error": {"message"}}) or whatever else came, readably.
  async function httpError(response) {
    let detail = '';
    try {
      const text = await response.text();
      try { detail = JSON.parse(text).error.message; } catch (e) { detail = text.slice(0, 500); }
    } catch (e) { /* the body could not be read: the status says enough */ }
    return new HttpError(response.status,
                         `HTTP ${response.status} ${response.statusText}${detail ? ': ' + detail : ''}`);
  }

  // ---- API key ----
  let keyRetry = null; // what to do once a key is saved
  function headers() {
    const h = { 'Content-Type': 'application/json' };
    const key = store.get('api_key');
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }
  function askForKey(reason, retry) {
    ui.keyReason.textContent = reason;
    ui.keyInput.value = store.get('api_key') || '';
    keyRetry = retry || null;
    if (!ui.keyDialog.open) ui.keyDialog.showModal();
    ui.keyInput.focus();
  }
  function closeKeyDialog(save) {
    if (save !== undefined) { store.set('api_key', save); showKeyState(); }
    ui.keyDialog.close();
    const retry = keyRetry;
    keyRetry = null;
    if (save !== undefined && retry) retry();
  }
  ui.keySave.addEventListener('click', () => closeKeyDialog(ui.keyInput.value.trim()));
  ui.keyInput.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); closeKeyDialog(ui.keyInput.value.trim()); }
  });
  ui.keyClear.addEventListener('click', () => closeKeyDialog(''));
  ui.keyCancel.addEventListener('click', () => closeKeyDialog(undefined));
  ui.setKey.addEventListener('click', () =>
    askForKey('The API key given to gptoss serve --api-key (kept in this browser).', loadModel));

  // ---- the model ----
  let modelName = null;
  let modelTimer = null;
  async function loadModel() {
    clearTimeout(modelTimer);
    try {
      const response = await fetch('/v1/models', { headers: headers() });
      if (response.status === 401) {
        ui.model.textContent = 'API key needed';
        askForKey('This server needs an API key (the one given to gptoss serve --api-key).', loadModel);
        return;
      }
      if (response.status === 503) { // still loading the weights: ask again shortly
        ui.model.textContent = 'loading the model…';
        modelTimer = setTimeout(loadModel, 2000);
        return;
      }
      if (!response.ok) throw await httpError(response);
      const list = await response.json();
      modelName = list.data && list.data[0] && list.data[0].id;
      ui.model.textContent = modelName || 'no model';
      ui.model.title = modelName ? `max_model_len ${list.data[0].max_model_len}` : '';
    } catch (e) {
      ui.model.textContent = 'offline';
      showError(`Cannot list the models: ${e.message}`);
      modelTimer = setTimeout(loadModel, 5000);
    }
  }

  // ---- the conversation ----
  const history = []; // {role: 'user'|'assistant', content}, sent with every request
  let controller = null; // the request in flight
  let epoch = 0; // counts "New chat" presses: a request of an older conversation leaves no trace

  function setBusy(busy) {
    ui.send.disabled = busy;
    ui.stop.hidden = !busy;
    ui.send.hidden = busy;
    document.body.classList.toggle('busy', busy);
  }

  function addMessage(role) {
    ui.empty.hidden = true;
    const box = document.createElement('div');
    box.className = 'msg ' + role;
    ui.messages.appendChild(box);
    return box;
  }
  function addUser(text) {
    const box = addMessage('user');
    const body = document.createElement('div');
    body.className = 'text';
    body.textContent = text;
    box.appendChild(body);
    return box;
  }
  function addAssistant() {
    const box = addMessage('assistant');
    box.classList.add('streaming');
    box.dataset.state = 'streaming';
    const details = document.createElement('details');
    details.className = 'reasoning';
    details.hidden = true;
    const summary = document.createElement('summary');
    summary.textContent = 'Thinking…';
    const reasoning = document.createElement('div');
    reasoning.className = 'reasoning-text';
    details.append(summary, reasoning);
    const answer = document.createElement('div');
    answer.className = 'answer';
    const meta = document.createElement('div');
    meta.className = 'meta';
    box.append(details, answer, meta);
    return { box, details, summary, reasoning, answer, meta };
  }
  function scrollDown() {
    const m = ui.messages;
    if (m.scrollHeight - m.scrollTop - m.clientHeight < 120) m.scrollTop = m.scrollHeight;
  }

  // Server-sent events from a fetch response: calls onEvent(object) per `data:` JSON, returns
  // at `data: [DONE]`; an end before it is an error (the connection broke).
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = /\r?\n\r?\n/.exec(buffer))) {
        const block = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data === '') continue;
        if (data === '[DONE]') return;
        let event;
        try { event = JSON.parse(data); } catch (e) {
          throw new Error('the server sent an event that is not JSON: ' + data.slice(0, 200));
        }
        onEvent(event);
      }
    }
    throw new Error('the connection closed before the answer was complete');
  }

  function buildRequest() {
    const messages = [];
    const system = ui.system.value.trim();
    if (system) messages.push({ role: 'system', content: system });
    messages.push(...history);
    const request = { messages, stream: true, stream_options: { include_usage: true },
                      reasoning_effort: ui.effort.value };
    if (modelName) request.model = modelName;
    const temperature = number(ui.temperature, 'Temperature', false);
    const topP = number(ui.topP, 'Top p', false);
    const maxTokens = number(ui.maxTokens, 'Max tokens', true);
    if (temperature !== undefined) request.temperature = temperature;
    if (topP !== undefined) request.top_p = topP;
    if (maxTokens !== undefined) request.max_tokens = maxTokens;
    return request;
  }

  async function send() {
    const text = ui.input.value.trim();
    if (!text || controller) return;
    clearError();
    history.push({ role: 'user', content: text });
    let request;
    try { request = buildRequest(); } catch (e) {
      history.pop();
      showError(e.message);
      return;
    }
    const conversation = epoch;
    const userBox = addUser(text);
    const view = addAssistant();
    ui.input.value = '';
    controller = new AbortController();
    setBusy(true);
    scrollDown();

    let answer = '', reasoning = '', finish = null, usage = null, streamError = null;
    let renderPending = false;
    const render = () => { // at most every 50 ms: markdown of a long answer is not free
      if (renderPending) return;
      renderPending = true;
      setTimeout(() => {
        renderPending = false;
        view.reasoning.textContent = reasoning;
        renderMarkdown(view.answer, answer);
        scrollDown();
      }, 50);
    };
    const started = performance.now();
    let firstToken = null;
    let outcome = 'done';
    try {
      const response = await fetch('/v1/chat/completions', {
        method: 'POST', headers: headers(), body: JSON.stringify(request), signal: controller.signal,
      });
      if (!response.ok) throw await httpError(response);
      await readEvents(response, (event) => {
        if (event.error) { streamError = event.error.message || JSON.stringify(event.error); return; }
        if (event.usage) usage = event.usage;
        const choice = event.choices && event.choices[0];
        if (!choice) return;
        const delta = choice.delta || {};
        if (delta.reasoning_content) {
          if (!reasoning) { view.details.hidden = false; view.details.open = true; }
          reasoning += delta.reasoning_content;
          if (firstToken === null) firstToken = performance.now();
        }
        if (delta.content) {
          // The answer begins: fold the reasoning away (a click opens it again).
          if (!answer && reasoning) view.details.open = false;
          answer += delta.content;
          if (firstToken === null) firstToken = performance.now();
        }
        if (choice.finish_reason) finish = choice.finish_reason;
        render();
      });
      if (streamError) outcome = 'error';
    } catch (e) {
      if (e.name === 'AbortError') {
        outcome = 'stopped';
      } else {
        outcome = 'error';
        streamError = e.message;
        if (e.status === 401) {
          // Nothing was generated: take the turn back so that it can be sent with a key.
          history.pop();
          userBox.remove();
          view.box.remove();
          ui.input.value = text;
          controller = null;
          setBusy(false);
          askForKey('The server refused the request: it needs an API key (gptoss serve --api-key).',
                    send);
          return;
        }
      }
    }
    controller = null;
    setBusy(false);
    if (epoch !== conversation) return; // "New chat" was pressed meanwhile

    view.reasoning.textContent = reasoning;
    renderMarkdown(view.answer, answer);
    view.summary.textContent = 'Reasoning';
    view.box.classList.remove('streaming');
    view.box.classList.add(outcome);
    view.box.dataset.state = outcome;
    view.box.dataset.finish = finish || '';
    const notes = [];
    if (outcome === 'stopped') notes.push('stopped');
    if (finish && outcome !== 'stopped') notes.push(`finish: ${finish}`);
    if (usage) {
      notes.push(`${usage.completion_tokens} tokens`);
      const seconds = (performance.now() - (firstToken || started)) / 1000;
      if (usage.completion_tokens > 1 && seconds > 0)
        notes.push(`${(usage.completion_tokens / seconds).toFixed(1)} tok/s`);
    }
    view.meta.textContent = notes.join(' · ');

    if (answer) {
      history.push({ role: 'assistant', content: answer });
    } else if (outcome === 'error') {
      // Nothing came back: forget the turn and give the text back for another try.
      history.pop();
      userBox.remove();
      view.box.remove();
      if (!ui.input.value) ui.input.value = text;
    }
    // A stop before any answer leaves the user's turn in the conversation on its own: the next
    // message follows it, as it does on the page.
    if (outcome === 'error') showError(streamError);
    if (ui.messages.querySelectorAll('.msg').length === 0) ui.empty.hidden = false;
    scrollDown();
    ui.input.focus();
  }

  ui.composer.addEventListener('submit', (e) => { e.preventDefault(); send(); });
  ui.input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  ui.stop.addEventListener('click', () => { if (controller) controller.abort(); });
  ui.newChat.addEventListener('click', () => {
    if (controller) controller.abort();
    epoch++;
    history.length = 0;
    for (const m of ui.messages.querySelectorAll('.msg')) m.remove();
    ui.empty.hidden = false;
    clearError();
    ui.input.focus();
  });

  loadModel();
  ui.input.focus();
})();
