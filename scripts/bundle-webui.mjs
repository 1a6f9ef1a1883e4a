#!/usr/bin/env node
// bundle-webui.mjs - builds the chat page served at GET / into one self-contained HTML file
// and a C source holding it, compiled into the server (web/webui.cmake runs it at build time).
//
//   node scripts/bundle-webui.mjs SOURCE_DIR OUT_C [OUT_HTML]
//
// Reads web/index.html (the template), web/style.css and web/app.js, and the browser builds of
// the libraries from SOURCE_DIR/node_modules (installed by scripts/setup): marked (UMD build),
// DOMPurify (dist/purify.min.js) and highlight.js (its CommonJS core and a few languages,
// wrapped here into one script because the npm package ships no browser bundle). Everything is
// inlined: the page loads nothing from the network. The libraries' license notices are kept in
// a comment at the top of the page.
//
// The C source defines gptoss_webui_html (bytes) and its length, the Content-Security-Policy
// for it (the one inline script allowed by its SHA-256, so an event handler attribute that
// slipped into the page could not run) and an ETag (a hash of the page).
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

const [sourceDir, outC, outHtml] = process.argv.slice(2);
if (!sourceDir || !outC) {
  console.error('usage: node scripts/bundle-webui.mjs SOURCE_DIR OUT_C [OUT_HTML]');
  process.exit(2);
}
const modules = join(sourceDir, 'node_modules');

function read(path) {
  if (!existsSync(path)) {
    const inModules = path.startsWith(modules);
    console.error(`bundle-webui: missing ${path}` +
      (inModules ? '\nbundle-webui: run scripts/setup (it installs the npm packages the web page ' +
                   'bundles), or configure with -DGPTOSS_WEBUI=OFF to build without the page'
                 : ''));
    process.exit(1);
  }
  return readFileSync(path, 'utf8');
}

// Languages highlighted in code blocks (others are shown without colours).
const languages = ['bash', 'c', 'cpp', 'css', 'diff', 'go', 'java', 'javascript', 'json',
                   'markdown', 'plaintext', 'python', 'rust', 'sql', 'typescript', 'xml', 'yaml'];

// A CommonJS file (no require() calls, as highlight.js's core and languages are) as an
// expression giving its module.exports.
function commonjs(path) {
  const code = read(path);
  if (/\brequire\s*\(/.test(code)) {
    console.error(`bundle-webui: ${path} calls require(); only self-contained files can be wrapped`);
    process.exit(1);
  }
  return `(function () { var module = { exports: {} }, exports = module.exports;\n${code}\n` +
         `return module.exports; })()`;
}

const hljsParts = [`var hljs = ${commonjs(join(modules, 'highlight.js/lib/core.js'))};`];
for (const lang of languages)
  hljsParts.push(`hljs.registerLanguage('${lang}', ` +
                 `${commonjs(join(modules, `highlight.js/lib/languages/${lang}.js`))});`);

const libraries = [
  read(join(modules, 'marked/lib/marked.umd.js')),
  read(join(modules, 'dompurify/dist/purify.min.js')),
  hljsParts.join('\n'),
];
const app = read(join(sourceDir, 'web/app.js'));

// Inside <script>, "</script" would end the element and "<!--" changes how the HTML parser
// reads what follows. Both only occur in the libraries' string and regular-expression
// literals, where "<\/" and "<\x21--" mean the same characters.
function scriptSafe(code) {
  const out = code.replace(/<\/(script)/gi, '<\\/$1').replace(/<!--/g, '<\\x21--');
  if (/<\/script|<!--/i.test(out)) throw new Error('unescaped </script or <!-- left');
  return out;
}
const script = scriptSafe(libraries.join('\n;\n') + '\n;\n' + app);

const hljsTheme = read(join(modules, 'highlight.js/styles/github.min.css'));
const hljsDark = read(join(modules, 'highlight.js/styles/github-dark.min.css'));
const style = read(join(sourceDir, 'web/style.css')) + '\n' + hljsTheme + '\n' +
              `@media (prefers-color-scheme: dark) {\n${hljsDark}\n}\n`;
if (/<\/style/i.test(style)) throw new Error('</style in the style sheet');

const notices = [
  ['marked', 'marked/package.json', 'marked/LICENSE'],
  ['DOMPurify', 'dompurify/package.json', 'dompurify/LICENSE'],
  ['highlight.js', 'highlight.js/package.json', 'highlight.js/LICENSE'],
].map(([name, pkg, license]) => {
  const version = JSON.parse(read(join(modules, pkg))).version;
  return `${name} ${version}\n\n${read(join(modules, license)).trim()}\n`;
});
const comment = 'This page bundles the following libraries; their license notices follow.\n\n' +
                notices.join('\n' + '='.repeat(78) + '\n\n');
if (comment.includes('--')) throw new Error('"--" in a license text cannot go in an HTML comment');

let html = read(join(sourceDir, 'web/index.html'));
for (const [marker, text] of [['<!-- @licenses -->', `<!--\n${comment}-->`],
                              ['/* @style */', style],
                              ['/* @script */', script]]) {
  const at = html.indexOf(marker);
  if (at < 0 || html.indexOf(marker, at + 1) >= 0)
    throw new Error(`web/index.html must hold ${marker} exactly once`);
  html = html.slice(0, at) + text + html.slice(at + marker.length);
}
if (/(src|href)\s*=\s*["']?(https?:)?\/\//i.test(html.replace(/<!--[\s\S]*?-->/, '')))
  console.warn('bundle-webui: warning: the page names an external URL; it must load nothing');

const scriptHash = createHash('sha256').update(script, 'utf8').digest('base64');
const csp = `default-src 'none'; script-src 'sha256-${scriptHash}'; style-src 'unsafe-inline'; ` +
            `img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'`;
const bytes = Buffer.from(html, 'utf8');
const etag = `"${createHash('sha256').update(bytes).digest('hex').slice(0, 20)}"`;

const rows = [];
for (let i = 0; i < bytes.length; i += 24)
  rows.push(Array.from(bytes.subarray(i, i + 24), (b) => `${b}`).join(','));
const cString = (s) => JSON.stringify(s); // ASCII only: JSON's escapes are C's
const source = `/* Generated by scripts/bundle-webui.mjs from web/ and node_modules: do not edit. */
#include "server/webui_page.h"

const unsigned char gptoss_webui_html[] = {
${rows.join(',\n')}};
const size_t gptoss_webui_html_len = ${bytes.length};
const char gptoss_webui_csp[] = ${cString(csp)};
const char gptoss_webui_etag[] = ${cString(etag)};
`;
mkdirSync(dirname(outC), { recursive: true });
writeFileSync(outC, source);
if (outHtml) writeFileSync(outHtml, html);
console.log(`bundle-webui: ${bytes.length} bytes of HTML (${languages.length} highlighted ` +
            `languages) -> ${outC}`);
