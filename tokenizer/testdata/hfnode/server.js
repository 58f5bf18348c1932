// Answers tokenizer requests over stdin/stdout, one JSON object a line, with
// HF tokenizers' Node.js binding; stub/tokenizers (a stand-in for the Python
// package) drives it. See README.md.
const { Tokenizer } = require('tokenizers');
const readline = require('readline');
const toks = [];
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', async (line) => {
  const r = JSON.parse(line);
  let res = {};
  try {
    switch (r.op) {
      case 'from_str': toks.push(Tokenizer.fromString(r.s)); res = { h: toks.length - 1 }; break;
      case 'from_file': toks.push(Tokenizer.fromFile(r.path)); res = { h: toks.length - 1 }; break;
      case 'save': toks[r.h].save(r.path, true); break;
      case 'encode': { const e = await toks[r.h].encode(r.s, null, { addSpecialTokens: r.add }); res = { ids: Array.from(e.getIds()) }; break; }
      case 'decode': res = { s: await toks[r.h].decode(r.ids, r.skip) }; break;
      case 'token_to_id': { const v = toks[r.h].tokenToId(r.t); res = { id: v === null || v === undefined ? null : v }; break; }
      case 'vocab_size': res = { n: toks[r.h].getVocabSize(true) }; break;
    }
  } catch (e) { res = { error: String(e) }; }
  process.stdout.write(JSON.stringify(res) + '\n');
});
