// Answers for one tokenizer.json, from HF tokenizers' Node.js binding:
//   node oracle.js tokenizer.json < requests.jsonl
// Each request line is {"text": s} (answered with ids, ids_plain, decode,
// decode_skip as in testdata/hf/expected.jsonl.gz) or {"ids": [...]}
// (decode, decode_skip); one answer a line, {"error": ...} where HF failed.
const { Tokenizer } = require('tokenizers');
const fs = require('fs');
async function main() {
  const tok = Tokenizer.fromFile(process.argv[2]);
  const lines = fs.readFileSync(0, 'utf8').split('\n').filter(l => l.length);
  const out = [];
  for (const l of lines) {
    const r = JSON.parse(l);
    try {
    if (r.text !== undefined) {
      const e = await tok.encode(r.text, null, { addSpecialTokens: true });
      const p = await tok.encode(r.text, null, { addSpecialTokens: false });
      const ids = Array.from(e.getIds()), plain = Array.from(p.getIds());
      out.push(JSON.stringify({ text: r.text, ids, ids_plain: plain,
        decode: await tok.decode(plain, false), decode_skip: await tok.decode(ids, true) }));
    } else {
      out.push(JSON.stringify({ decode_ids: r.ids, decode: await tok.decode(r.ids, false), decode_skip: await tok.decode(r.ids, true) }));
    }
    } catch (e) { out.push(JSON.stringify({ error: String(e), text: r.text })); }
  }
  process.stdout.write(out.join('\n') + '\n');
}
main();
