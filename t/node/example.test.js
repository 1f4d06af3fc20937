'use strict';
// examples/node/vsearch.js at 2 ranks: searches over HTTP equal the
// brute-force answer; after rank 1 is SIGKILLed a search gets 503 naming
// it, /healthz still answers (the loop is alive), SIGTERM stops rank 0.
const { test } = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');

const EXAMPLE = path.resolve(__dirname, '..', '..', 'examples', 'node', 'vsearch.js');
const vs = require(EXAMPLE);

const freePort = () => new Promise((resolve) => {
  const s = net.createServer().listen(0, '127.0.0.1', () => {
    const { port } = s.address();
    s.close(() => resolve(port));
  });
});

async function post(url, body) {
  const r = await fetch(url + '/search', { method: 'POST', body: JSON.stringify(body) });
  return [r.status, await r.json()];
}

test('the vector search service survives a rank', { timeout: 120000 }, async () => {
  const port = await freePort();
  const procs = [0, 1].map((r) => spawn(process.execPath, [EXAMPLE, '--port', '0', '--rows', '3000', '--dim', '8'], {
    env: { ...process.env, RANK: String(r), WORLD_SIZE: '2', MASTER_ADDR: '127.0.0.1',
           MASTER_PORT: String(port), UVCCL_HEARTBEAT_TIMEOUT_MS: '3000' },
    stdio: ['ignore', 'pipe', 'inherit'],
  }));
  try {
    const line = await new Promise((resolve, reject) => {
      let buf = '';
      procs[0].stdout.on('data', (d) => {
        buf += d;
        if (buf.includes('\n')) resolve(buf.split('\n')[0]);
      });
      procs[0].on('exit', (c) => reject(new Error('rank 0 exited ' + c + ': ' + buf)));
    });
    assert.match(line, /^listening on /);
    const url = 'http://' + line.split(' ').pop();
    const full = vs.table(3000, 8, 1);
    let seed = 7;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648) * 2 - 1;
    const queries = Array.from({ length: 12 }, () => Array.from({ length: 8 }, rnd));
    const answers = await Promise.all(queries.map((q) => post(url, { vector: q, k: 5 })));
    answers.forEach(([status, body], j) => {
      assert.strictEqual(status, 200, JSON.stringify(body));
      const want = vs.nearest(full, 8, 0, Float32Array.from(queries[j]), 5).map(([, id]) => id);
      assert.deepStrictEqual(body.results.map((h) => h.id), want);
    });
    const [bad, badBody] = await post(url, { vector: [1, 2, 3], k: 5 });
    assert.strictEqual(bad, 400);
    assert.match(badBody.error, /8 numbers/);
    procs[1].kill('SIGKILL');
    await new Promise((res) => procs[1].once('exit', res));
    const [status, body] = await post(url, { vector: queries[0], k: 5 });
    assert.strictEqual(status, 503, JSON.stringify(body));
    assert.strictEqual(body.failed_rank, 1);
    assert.match(body.error, /rank 1/);
    const health = await (await fetch(url + '/healthz')).json();
    assert.strictEqual(health.status, 'degraded');
    assert.strictEqual(health.failed_rank, 1);
    procs[0].kill('SIGTERM');
    const code = await new Promise((res) => procs[0].once('exit', res));
    assert.strictEqual(code, 0);
  } finally {
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
});
