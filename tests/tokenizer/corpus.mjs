// corpus.mjs - the deterministic tokenizer test corpus (>= 2 MB), built at test time.
//
// makeCorpus() returns [{name, text}] documents combining hand-written material in many
// scripts with generated stress cases (whitespace runs, digits, contractions, special-token
// look-alikes, code, JSON, markdown, emoji sequences). A seeded PRNG makes every run produce
// the same bytes, so a failure names a document that can be regenerated exactly.
// Strings are well-formed Unicode (no lone surrogates): invalid UTF-8 is tested in C.

// mulberry32: a tiny seeded PRNG, plenty for shuffling test material.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pick = (r, list) => list[Math.floor(r() * list.length)];
const int = (r, lo, hi) => lo + Math.floor(r() * (hi - lo + 1));

// Prose, written for this corpus, a few sentences per language or script.
export const PROSE = {
  english: [
    "The harbor lights flickered as the last ferry pulled away from the pier.",
    "She didn't think the bridge would hold, but they'd already started across.",
    "Numbers like 3.14159, 2,718 and 1e-9 show up in every physics notebook.",
    "Mr. O'Neil's dog isn't allowed in the library; it's been that way since '98.",
    "We'll meet at 7:45 p.m. on Tuesday, unless you've got other plans.",
  ],
  chinese: [
    "清晨的雾气笼罩着整个山谷，远处传来几声鸟鸣。",
    "他把旧书整理好，放进了靠窗的那个木箱里。",
    "这座城市的地铁每天运送超过八百万名乘客。",
    "学习一门新的编程语言需要耐心和大量的练习。",
  ],
  japanese: [
    "雨が降り始めたので、私たちは近くの喫茶店に入りました。",
    "東京駅から新幹線で大阪まで約二時間半かかります。",
    "カタカナで書かれた「コンピューター」という言葉はよく見かけます。",
    "ひらがなとカタカナと漢字を混ぜて書くのが日本語の特徴です。",
  ],
  korean: [
    "오늘은 날씨가 맑아서 한강 공원에 산책을 나갔습니다.",
    "이 프로그램은 입력된 문장을 토큰 단위로 나누어 처리합니다.",
    "할머니께서 만들어 주신 김치찌개가 정말 맛있었어요.",
  ],
  arabic: [
    "يحب الأطفال اللعب في الحديقة بعد انتهاء الدروس.",
    "تقع المكتبة الوطنية بالقرب من ساحة المدينة القديمة.",
    "كتب الطالب ١٢٣ صفحة عن تاريخ العلوم في القرن العاشر.",
  ],
  hebrew: [
    "הספרייה נפתחת בשעה תשע בבוקר ונסגרת בערב.",
    "הילדים שיחקו בחוף הים עד שהשמש שקעה.",
    "המתכנתת כתבה בדיקות לכל פונקציה חדשה בקוד.",
  ],
  hindi: [
    "सुबह की ठंडी हवा में पेड़ों की पत्तियाँ धीरे-धीरे हिल रही थीं।",
    "भारत में कई भाषाएँ बोली जाती हैं और हर एक की अपनी लिपि है।",
    "उसने बाज़ार से ताज़ी सब्ज़ियाँ और १२ केले खरीदे।",
  ],
  thai: [
    "วันนี้อากาศดีมากเราจึงไปเดินเล่นที่สวนสาธารณะ",
    "ภาษาไทยไม่เว้นวรรคระหว่างคำ ทำให้การตัดคำเป็นเรื่องยาก",
    "ร้านอาหารริมแม่น้ำเปิดจนถึงเที่ยงคืน",
  ],
  russian: [
    "Вечером над рекой поднялся густой туман, и огни города расплылись.",
    "Программа читает текст, разбивает его на части и считает токены.",
    "В 2023 году библиотека получила более 15 000 новых книг.",
  ],
  greek: [
    "Το πρωί η θάλασσα ήταν ήρεμη και τα καΐκια έβγαιναν για ψάρεμα.",
    "Η φιλοσοφία γεννήθηκε στις πόλεις της αρχαίας Ιωνίας.",
    "ΑΥΤΟ ΕΙΝΑΙ ΕΝΑ ΚΕΙΜΕΝΟ ΜΕ ΚΕΦΑΛΑΙΑ ΓΡΑΜΜΑΤΑ.",
  ],
  german: [
    "Die Straßenbahn fährt alle zehn Minuten über die Brücke am Fluss.",
    "Größere Übersetzungsprojekte benötigen sorgfältige Qualitätsprüfungen.",
  ],
  french: [
    "L'été dernier, nous sommes allés à la mer près de Saint-Malo.",
    "C'est l'histoire d'un garçon qu'on appelait « le rêveur ».",
  ],
  spanish: [
    "¿Dónde está la estación de trenes? ¡Necesito llegar antes de las ocho!",
    "El niño comió una manzana y después jugó con su perro.",
  ],
  vietnamese: [
    "Hôm nay trời đẹp nên chúng tôi đi dạo quanh hồ Hoàn Kiếm.",
    "Tiếng Việt có sáu thanh điệu và dùng chữ cái Latinh có dấu.",
  ],
  turkish: [
    "İstanbul'da Boğaz'ın iki yakasını köprüler birbirine bağlar.",
    "Çocuklar ağaçların gölgesinde dinlendiler.",
  ],
  tamil: [
    "இன்று காலை மழை பெய்ததால் சாலைகள் ஈரமாக இருந்தன.",
  ],
  georgian_armenian: [
    "საქართველოს დედაქალაქი თბილისია.",
    "Երևանը Հայաստանի մայրաքաղաքն է։",
  ],
  polish_czech: [
    "Zażółć gęślą jaźń — to zdanie zawiera wszystkie polskie znaki.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
  ],
  combining: [
    "Cafe\u0301 na\u0308ive re\u0301sume\u0301 with combining accents.",
    "Z\u0351\u0352a\u0353l\u0354g\u0355o\u0356 text stacks marks: e\u0301\u0302\u0303\u0304.",
    "Hangul jamo: \u1100\u1161\u11A8 and precomposed 각.",
  ],
};

export const EMOJI = [
  "👋", "👋🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏼‍🚀", "❤️‍🔥", "🇯🇵", "🇺🇸🇫🇷",
  "😀😃😄😁", "🤦🏻‍♂️", "👩🏾‍🤝‍👩🏻", "✋🏻✋🏼✋🏽✋🏾✋🏿", "🐈‍⬛", "1️⃣", "#️⃣", "©️", "🫠", "🦀",
];

export const CODE = [
  `#include <stdio.h>\n\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; i++) {\n        printf("%d: %s\\n", i, argv[i]);\n    }\n    return 0;\n}\n`,
  `def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nif __name__ == "__main__":\n    print([fib(i) for i in range(20)])\n`,
  `fn main() {\n    let words: Vec<&str> = "a b c".split(' ').collect();\n    println!("{:?} {}", words, words.len());\n}\n`,
  `const sum = (xs) => xs.reduce((a, b) => a + b, 0);\nexport default async function load(url) {\n\tconst res = await fetch(url);\n\tif (!res.ok) throw new Error(\`HTTP \${res.status}\`);\n\treturn res.json();\n}\n`,
  `SELECT u.id, COUNT(*) AS n\n  FROM users u JOIN orders o ON o.user_id = u.id\n WHERE o.created_at >= '2024-01-01'\n GROUP BY u.id\nHAVING n > 10;\n`,
  `package main\n\nimport "fmt"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tch <- 42\n\tfmt.Println(<-ch)\n}\n`,
  `#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk '{print $1}'\ndone 2>/dev/null || echo "none"\n`,
  `<!DOCTYPE html>\n<html lang="en">\n  <body class="main">\n    <p id='x'>Hello &amp; welcome</p>\n  </body>\n</html>\n`,
  `template <typename T>\nstd::vector<T> take(const std::vector<T>& v, size_t n) {\n  return {v.begin(), v.begin() + std::min(n, v.size())};\n}\n`,
  `\\begin{equation}\n  E = mc^2 \\quad \\forall x \\in \\mathbb{R}\n\\end{equation}\n`,
];

export const MARKDOWN = [
  "# Title\n\nSome *emphasis*, **bold**, `code` and a [link](https://example.com/a?b=c&d=e).\n\n- item one\n- item two\n  - nested item\n\n> quoted text\n\n```python\nprint('hi')\n```\n",
  "| col a | col b |\n|------:|:-----:|\n| 1 | 2 |\n| 10 | 20 |\n\n---\n\n1. first\n2. second\n",
];

export const SPECIAL_LOOKALIKES = [
  "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>",
  "<|endoftext|>", "<|startoftext|>", "<|endofprompt|>", "<|reserved_200000|>", "<|end", "<|", "|>",
  "<|start", "start|>", "< |end| >", "<||>", "<|<|end|>|>", "<|END|>", "<|start |>",
];

export const CONTRACTIONS = [
  "'S", "'T", "'Re", "'vE", "'LL", "'d", "'s", "'t", "'re", "'ve", "'m", "'M", "'ll", "'D", "'RE",
  "'Ve", "'lL", "'x", "''", "'", "'İ", "’s", // not "'ſ": see test_pretokenize.c
];

function digitRun(r, n) {
  let s = String(int(r, 1, 9));
  while (s.length < n) s += String(int(r, 0, 9));
  return s;
}

function whitespace(r) {
  return pick(r, [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ", " \t ", "\r\n\r\n",
    "\u00a0", "\u3000", "\u2003", " ".repeat(int(r, 4, 40)), "\t".repeat(int(r, 2, 9)),
    "\n".repeat(int(r, 3, 12)), " \r\n \r\n", "\r\r", "\n\r",
  ]);
}

function proseSentence(r) {
  const lang = pick(r, Object.keys(PROSE));
  return pick(r, PROSE[lang]);
}

// One mixed document: prose with every kind of insert between sentences.
function mixedDocument(r, targetBytes) {
  const parts = [];
  let size = 0;
  while (size < targetBytes) {
    let piece;
    const k = r();
    if (k < 0.45) piece = proseSentence(r);
    else if (k < 0.52) piece = pick(r, EMOJI).repeat(int(r, 1, 3));
    else if (k < 0.58) piece = digitRun(r, int(r, 1, 14));
    else if (k < 0.64) {
      const word = pick(r, ["it", "DON", "they", "We", "I", "she", "o", "rock", "x", "Y", "été", "ΑΥΤΟ", "naïve"]);
      piece = word + pick(r, CONTRACTIONS) + pick(r, ["", " ", "s", "n", "."]);
    } else if (k < 0.69) piece = pick(r, SPECIAL_LOOKALIKES);
    else if (k < 0.74) piece = pick(r, CODE);
    else if (k < 0.77) piece = pick(r, MARKDOWN);
    else if (k < 0.80) piece = JSON.stringify({ id: int(r, 0, 99999), name: proseSentence(r), tags: ["a", "b"], ok: r() < 0.5, v: r() * 100 }, null, int(r, 0, 1) ? 2 : 0);
    else if (k < 0.83) piece = pick(r, ["$", "€", "£", "¥", "%", "…", "—", "–", "«", "»", "“", "”", "•", "→", "∀x∈ℝ", "½", "²", "Ⅻ", "①②"]).repeat(int(r, 1, 4));
    else if (k < 0.86) piece = pick(r, ["HTTPServer", "getHTTPResponseCode", "XMLHttpRequest", "snake_case_name", "camelCaseName", "__init__", "ALLCAPS", "MiXeD CaSe WoRdS", "iPhone", "macOS"]);
    else if (k < 0.89) piece = pick(r, ["https://example.org/path/to/file.html?q=1#frag", "user@example.com", "C:\\Windows\\System32", "/usr/local/bin/", "../../etc/passwd", "a/b/c\n/d", "x = y // comment\n"]);
    else piece = whitespace(r);
    parts.push(piece);
    parts.push(whitespace(r));
    size += Buffer.byteLength(piece) + 1;
  }
  return parts.join("");
}

// Stress documents, each targeting one regex alternative or the long-piece BPE path.
function stressDocuments(r) {
  const docs = [];
  for (const n of [1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097]) docs.push({ name: `spaces-${n}`, text: "a" + " ".repeat(n) + "b" + " ".repeat(n) });
  for (const n of [2, 9, 300]) docs.push({ name: `tabs-newlines-${n}`, text: "x" + "\t".repeat(n) + "\n".repeat(n) + "y" + " \r\n".repeat(n) + "\r".repeat(n) + "z\n" });
  for (let n = 1; n <= 40; n++) docs.push({ name: `digits-${n}`, text: `${digitRun(r, n)} ${"0".repeat(n)} a${digitRun(r, n)}b ${digitRun(r, n)}.${digitRun(r, n)}` });
  docs.push({ name: "digits-long", text: digitRun(r, 5000) });
  docs.push({ name: "letters-long", text: Array.from({ length: 20000 }, () => String.fromCharCode(97 + int(r, 0, 25))).join("") });
  docs.push({ name: "word-repeat-long", text: "abc".repeat(3000) + "ABC".repeat(3000) });
  docs.push({ name: "cjk-long", text: PROSE.chinese.join("").repeat(40).replace(/[，。]/g, "") });
  docs.push({ name: "thai-long", text: PROSE.thai.join("").replace(/ /g, "").repeat(30) });
  docs.push({ name: "emoji-long", text: EMOJI.join("").repeat(50) });
  docs.push({ name: "punct-long", text: "!?.,;:-_=+*&^%$#@~`|\\/<>[]{}()".repeat(100) + "\n/\n/" });
  docs.push({ name: "specials-all", text: SPECIAL_LOOKALIKES.join(" ") + SPECIAL_LOOKALIKES.join("") });
  docs.push({ name: "contractions-all", text: CONTRACTIONS.map((c) => "word" + c).join(" ") + " " + CONTRACTIONS.map((c) => "WORD" + c + "x").join("") });
  docs.push({ name: "control-chars", text: Array.from({ length: 32 }, (_, i) => String.fromCharCode(i) + "a" + String.fromCharCode(i)).join("") + "\u007f\u0080\u009f" });
  docs.push({ name: "unicode-spaces", text: ["\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u000b", "\u000c"].map((s) => `a${s}b${s}${s}c ${s}\n`).join("") });
  // U+0085 and U+FEFF are left out: JavaScript's \s disagrees with tiktoken's on them
  // (see test_pretokenize.c), so gpt-tokenizer is not a valid reference there.
  docs.push({ name: "all-bmp-sample", text: Array.from({ length: 3000 }, () => { let cp; do { cp = int(r, 0x20, 0xfffd); } while ((cp >= 0xd800 && cp <= 0xdfff) || cp === 0x85 || cp === 0xfeff); return String.fromCodePoint(cp); }).join("") });
  docs.push({ name: "astral-sample", text: Array.from({ length: 1500 }, () => String.fromCodePoint(int(r, 0x10000, 0x10ffff))).join("") });
  return docs;
}

export function makeCorpus(minBytes = 2.2e6) {
  const r = rng(0x6a5f0e11);
  const docs = stressDocuments(r);
  Object.entries(PROSE).forEach(([lang, sentences]) => docs.push({ name: `prose-${lang}`, text: sentences.join(" ") + "\n" + sentences.join("\n") }));
  CODE.forEach((c, i) => docs.push({ name: `code-${i}`, text: c }));
  MARKDOWN.forEach((m, i) => docs.push({ name: `markdown-${i}`, text: m }));
  let total = docs.reduce((s, d) => s + Buffer.byteLength(d.text), 0);
  for (let i = 0; total < minBytes; i++) {
    const text = mixedDocument(r, int(r, 200, 12000));
    docs.push({ name: `mixed-${i}`, text });
    total += Buffer.byteLength(text);
  }
  return docs;
}
