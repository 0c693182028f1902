'use strict';
// A leaky node script for the JIT-names test: on "go" (stdin), a named JS
// function keeps 2000 Buffers of 64-88 KiB (allocUnsafeSlow above node's
// 8 KiB pool: each backing store comes from glibc malloc, called from C++
// called by JS); then "done", and it stays alive, holding them, until its
// stdin closes.
//
// The allocations run from a timer that has already run (with the same
// function, keeping nothing) 20 times before "ready", and not after: the
// JIT code on their path exists before the tracer attaches and reads the
// process's maps, and no garbage of the warm-up is made while it traces.
const kept = [];
function leakyFunctionName(n, into) {
  for (let i = 0; i < n; i++) {
    const b = Buffer.allocUnsafeSlow(65536 + (i % 7) * 4096);
    b[0] = i & 0xff;
    into.push(b);
  }
}
let ticks = 0;
let go = false;
let finished = false;
const timer = setInterval(() => {
  ticks++;
  if (!go) {
    // Warm-up only before "ready": garbage made once the tracer may be
    // attached would count as in use until V8's collector frees it.
    if (ticks <= 20) leakyFunctionName(100, []);
    if (ticks === 20) console.log('ready');
    return;
  }
  if (finished) return;
  finished = true;
  for (let r = 0; r < 20; r++) leakyFunctionName(100, kept);
  let sum = 0;
  for (const b of kept) sum += b[0];
  console.log('done', kept.length, sum);
  clearInterval(timer);
}, 1);
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  if (chunk.includes('go')) go = true;
});
