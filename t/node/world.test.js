'use strict';
// Multi-process worlds of the Node.js addon: ranks.js in 2-4 processes
// (env://), every check of a scenario passed on every rank.
const { test } = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const net = require('node:net');
const path = require('node:path');

const HERE = __dirname;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

function run(cmd, args, env) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    // a rank that hangs is killed, its output kept for the report
    const timer = setTimeout(() => { out += '\n(killed: ran past 150 s)'; p.kill('SIGKILL'); }, 150000);
    let out = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (out += d));
    p.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out });
    });
  });
}

async function world(scenario, n, extraEnv = {}) {
  const port = await freePort();
  return Promise.all(Array.from({ length: n }, (_, r) =>
    run(process.execPath, [path.join(HERE, 'ranks.js'), scenario], {
      ...process.env, RANK: String(r), WORLD_SIZE: String(n),
      MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(port), ...extraEnv,
    })));
}

function assertPassed(res, r, names) {
  const lines = res.out.split('\n');
  const bad = lines.filter((l) => l.startsWith('not ok'));
  const missing = names.filter((n) => !lines.includes('ok ' + n));
  assert.ok(res.code === 0 && bad.length === 0 && missing.length === 0 && lines.includes('done'),
            `rank ${r} (exit ${res.code} ${res.signal}): bad ${JSON.stringify(bad)} ` +
            `missing ${JSON.stringify(missing)}\n${res.out}`);
}

const COLLECTIVES = [
  'init', 'allreduce_dtypes', 'allreduce_avg', 'allreduce_buffer',
  'allreduce_offset_view', 'allreduce_4MiB', 'allreduce_bfloat16',
  'broadcast_roots', 'reduce_roots', 'allgather', 'reduce_scatter', 'alltoall',
  'gather', 'scatter', 'barrier', 'monitored_barrier', 'allreduce_coalesced',
  'allgatherv', 'reduce_scatterv', 'alltoallv', 'broadcast_bytes',
  'allgather_bytes', 'gather_bytes', 'scatter_bytes', 'broadcast_object',
  'all_gather_object', 'scatter_object', 'gather_object', 'batch_isend_irecv',
  'premul_sum', 'send_recv', 'recv_any',
  'concurrent', 'split', 'new_group', 'split_none', 'flight_recorder',
  'store_get', 'store_add', 'store_check', 'store_timeout', 'destroy',
];

for (const n of [2, 4]) {
  test(`every collective exact at ${n} ranks`, { timeout: 180000 }, async () => {
    (await world('collectives', n)).forEach((res, r) => assertPassed(res, r, COLLECTIVES));
  });
}

test('a peer SIGKILLed mid-allreduce: PeerError naming it, the loop alive, shrink', { timeout: 180000 }, async () => {
  const res = await world('kill', 3);
  assert.strictEqual(res[2].signal, 'SIGKILL', res[2].out);
  for (const r of [0, 1])
    assertPassed(res[r], r, ['peer_error', 'loop_alive', 'later_call', 'failure', 'shrink']);
});

test('wrong sizes across ranks: MismatchError naming both', { timeout: 120000 }, async () => {
  (await world('mismatch', 2, { UVCCL_DEBUG: 'detail' })).forEach((res, r) => assertPassed(res, r, ['mismatch']));
});

test('a timeout, then revoke', { timeout: 120000 }, async () => {
  (await world('timeout_revoke', 2)).forEach((res, r) =>
    assertPassed(res, r, ['timeout', 'after_timeout', 'revoked']));
});

test('abort: AbortedError here, PeerError naming the aborter there', { timeout: 120000 }, async () => {
  (await world('abort', 2)).forEach((res, r) => assertPassed(res, r, ['aborted_here', 'aborted_peer']));
});

test('groups from a store object and from tcp://', { timeout: 120000 }, async () => {
  (await world('init_store', 2)).forEach((res, r) => assertPassed(res, r, ['init_store', 'init_tcp_url']));
});
