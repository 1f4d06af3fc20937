'use strict';
// The Node.js addon in one process: a world of one rank over a HashStore,
// stores, bad arguments answered with clear rejections (the group still
// working after each), worker threads (a loop each), the process ending by
// itself once its groups are destroyed, and `npm install` of the package.
const { test } = require('node:test');
const assert = require('node:assert');
const { execFileSync, spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Worker } = require('node:worker_threads');

const ROOT = path.resolve(__dirname, '..', '..');
const uvccl = require(path.join(ROOT, 'node'));

async function worldOfOne() {
  return uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 });
}

async function stillWorks(pg) {
  const x = Float32Array.of(0, 1, 2, 3, 4);
  assert.strictEqual(await pg.allreduce(x), x);
  assert.deepStrictEqual(Array.from(x), [0, 1, 2, 3, 4]);
}

test('a world of one', async () => {
  const pg = await worldOfOne();
  assert.deepStrictEqual([pg.rank, pg.size], [0, 1]);
  await stillWorks(pg);
  const out = new BigInt64Array(3);
  await pg.allgather(out, BigInt64Array.of(1n, 2n, 3n));
  assert.deepStrictEqual(Array.from(out), [1n, 2n, 3n]);
  await pg.barrier({ timeout: 5000 });
  assert.strictEqual(pg.peerTransport(0), 'self');
  assert.strictEqual(pg.globalRank(0), 0);
  assert.strictEqual(pg.failure(), null);
  await pg.destroy();
});

test('file:// init', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'uvccl-node-'));
  const pg = await uvccl.initProcessGroup('file://' + path.join(dir, 'store'), { rank: 0, worldSize: 1 });
  const x = BigInt64Array.of(2n, 3n);
  await pg.allreduce(x, 'product');
  assert.deepStrictEqual(Array.from(x), [2n, 3n]);
  await pg.destroy();
  fs.rmSync(dir, { recursive: true, force: true });
});

const BAD_BUFFERS = [
  ['a string', 'text', TypeError, /must be a TypedArray, Buffer, DataView or ArrayBuffer/],
  ['a plain array', [1, 2, 3], TypeError, /must be a TypedArray/],
  ['a Uint16Array without a dtype', new Uint16Array(4), TypeError, /Uint16Array cannot be reduced/],
  ['a Uint32Array', new Uint32Array(4), TypeError, /Uint32Array cannot be reduced/],
  ['a BigUint64Array', new BigUint64Array(2), TypeError, /BigUint64Array cannot be reduced/],
  ['a DataView', new DataView(new ArrayBuffer(8)), TypeError, /DataView cannot be reduced/],
];

for (const [what, buf, cls, words] of BAD_BUFFERS) {
  test(`allreduce of ${what} rejects`, async () => {
    const pg = await worldOfOne();
    const p = pg.allreduce(buf);
    assert.ok(p instanceof Promise, 'a rejection, not a throw');
    await assert.rejects(p, (e) => e instanceof cls && words.test(e.message));
    await stillWorks(pg);
    await pg.destroy();
  });
}

test('bad arguments reject saying what is wrong', async () => {
  const pg = await worldOfOne();
  const x = new Float32Array(4);
  const cases = [
    [() => pg.allreduce(x, 'median'), RangeError, /unknown reduce op 'median'/],
    [() => pg.allreduce(x, { dtype: 'float128' }), RangeError, /unknown dtype 'float128'/],
    [() => pg.allreduce(new Uint8Array(6), { dtype: 'float32' }), RangeError, /whole number of float32/],
    [() => pg.allreduce(x, { timeout: -1 }), RangeError, /timeout/],
    [() => pg.allreduce(x, { timeout: 'soon' }), RangeError, /timeout/],
    [() => pg.allgather(new Float32Array(3), new Float32Array(4)), RangeError, /output holds 3 elements/],
    [() => pg.allgather(new Int32Array(4), new Float32Array(4)), TypeError, /output holds int32, the input float32/],
    [() => pg.broadcast(x, { src: 3 }), uvccl.InvalidArgumentError, /./],
    [() => pg.gather(x, null, { dst: 0 }), TypeError, /root needs an output/],
    [() => pg.alltoallv(x, x, [2, 2], [4]), RangeError, /sendCounts has 2 entries/],
    [() => pg.alltoallv(x, x, [3], [4]), RangeError, /add up to/],
    [() => pg.reduceScatterv(x, x, [-1]), RangeError, /not a non-negative integer/],
    [() => pg.allgatherv(x, x), TypeError, /outputs must be an array/],
    [() => pg.allreduceCoalesced([x, new Int32Array(2)]), TypeError, /buffer 1 holds int32, buffer 0 float32/],
    [() => pg.send(x), TypeError, /dst must be a rank/],
    [() => pg.send(x, 5), uvccl.InvalidArgumentError, /./],
    [() => pg.split('red'), TypeError, /color must be an integer/],
    [() => pg.batchIsendIrecv([{ op: 'put', buf: x, peer: 0 }]), TypeError, /op must be 'send' or 'recv'/],
    [() => pg.batchIsendIrecv([{ op: 'send', buf: 'x', peer: 0 }]), TypeError, /must be a TypedArray/],
    [() => pg.scatterBytes(null), TypeError, /the root gives an array of one buffer a rank/],
    [() => pg.broadcastBytes(42), TypeError, /must be a TypedArray/],
  ];
  for (const [call, cls, words] of cases) {
    const p = call();
    assert.ok(p instanceof Promise, call.toString());
    await assert.rejects(p, (e) => {
      assert.ok(e instanceof cls && words.test(e.message), `${call}: ${e.name}: ${e.message}`);
      return true;
    });
  }
  const e = await pg.broadcast(x, { src: 3 }).catch((err) => err);
  assert.ok(e instanceof uvccl.UvcclError && e instanceof Error);
  assert.strictEqual(e.name, 'InvalidArgumentError');
  assert.ok(e.errno < 0 && typeof e.code === 'string' && e.code.length > 0, e.code);
  assert.throws(() => pg.newGroup('all'), TypeError);
  assert.throws(() => pg.premulSum('half'), TypeError);
  assert.throws(() => pg.setTimeout(-5), RangeError);
  await stillWorks(pg);
  await pg.destroy();
});

test('a destroyed group and a closed store refuse', async () => {
  const pg = await worldOfOne();
  await pg.destroy();
  await pg.destroy(); // twice: nothing left to close
  await assert.rejects(pg.allreduce(new Float32Array(2)), (e) =>
    e instanceof uvccl.UvcclError && /destroyed/.test(e.message));
  assert.strictEqual(pg.rank, -1);
  const st = new uvccl.HashStore();
  await st.close();
  await assert.rejects(st.get('k'), /the store is closed/);
});

test('HashStore operations and timeouts', async () => {
  const st = new uvccl.HashStore();
  await st.set('a', 'one');
  await st.set('b', Buffer.from([0, 1, 2]));
  assert.strictEqual((await st.get('a')).toString(), 'one');
  assert.deepStrictEqual([...(await st.get('b'))], [0, 1, 2]);
  assert.strictEqual(await st.add('n', 5), 5);
  assert.strictEqual(await st.add('n'), 6);
  assert.strictEqual((await st.compareSet('a', 'one', 'two')).toString(), 'two');
  assert.strictEqual((await st.compareSet('a', 'nope', 'three')).toString(), 'two');
  assert.strictEqual(await st.check(['a', 'b']), true);
  assert.strictEqual(await st.check(['a', 'zzz']), false);
  assert.strictEqual(await st.numKeys(), 3);
  assert.strictEqual(await st.deleteKey('b'), true);
  assert.strictEqual(await st.deleteKey('b'), false);
  await st.append('a', '+');
  assert.strictEqual((await st.get('a')).toString(), 'two+');
  await st.multiSet(['m1', 'm2'], ['x', Buffer.from('yy')]);
  assert.deepStrictEqual((await st.multiGet(['m2', 'm1'])).map(String), ['yy', 'x']);
  assert.deepStrictEqual((await st.listKeys()).sort(), ['a', 'm1', 'm2', 'n']);
  await st.queuePush('q', 'first');
  await st.queuePush('q', 'second');
  assert.strictEqual(await st.queueLen('q'), 2);
  assert.strictEqual((await st.queuePop('q')).toString(), 'first');
  assert.strictEqual((await st.queuePop('q', { block: true })).toString(), 'second');
  await assert.rejects(st.queuePop('q'), (e) => e instanceof uvccl.UvcclError && e.code === 'UVCCL_EQEMPTY');
  await assert.rejects(st.multiSet(['k'], []), /one a key/);
  st.setTimeout(100);
  const t0 = Date.now();
  await assert.rejects(st.get('never'), (e) => e instanceof uvccl.TimeoutError);
  assert.ok(Date.now() - t0 >= 90);
  await assert.rejects(st.wait(['never'], { timeout: 50 }), (e) => e instanceof uvccl.TimeoutError);
  await assert.rejects(st.set(42, 'x'), /the key must be a string/);
  await assert.rejects(st.set('k', 42), /must be a string, Buffer or TypedArray/);
  await st.close();
});

test('a StoreServer and a TCPStore client in one process', async () => {
  const server = new uvccl.StoreServer({ host: '127.0.0.1', port: 0 });
  assert.ok(server.port > 0);
  const st = await uvccl.TCPStore.connect('127.0.0.1', server.port, { timeout: 5000 });
  await st.set('k', 'v');
  assert.strictEqual((await st.get('k')).toString(), 'v');
  await st.append('k', 'w');
  await st.multiSet(['m1', 'm2'], ['1', '2']);
  assert.deepStrictEqual((await st.multiGet(['k', 'm2'])).map(String), ['vw', '2']);
  await st.queuePush('q', 'item');
  assert.strictEqual(await st.queueLen('q'), 1);
  assert.strictEqual((await st.queuePop('q', { block: true })).toString(), 'item');
  assert.ok((await st.listKeys()).includes('m1'));
  const pg = await uvccl.initProcessGroup({ store: st, rank: 0, worldSize: 1, prefix: 'local' });
  await stillWorks(pg);
  await pg.destroy();
  await st.close();
  await server.close();
  // nobody there: a clear error once the connect timeout passes
  await assert.rejects(uvccl.TCPStore.connect('127.0.0.1', server.port, { timeout: 300 }),
                       (e) => e instanceof uvccl.UvcclError && e.errno < 0);
});

test('worker threads: a group on each thread\'s own loop', async () => {
  const code = `
    const { parentPort } = require('node:worker_threads');
    const uvccl = require(${JSON.stringify(path.join(ROOT, 'node'))});
    (async () => {
      const pg = await uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 });
      const x = Int32Array.of(7, 8);
      await pg.allreduce(x, 'max');
      await pg.destroy();
      parentPort.postMessage(Array.from(x));
    })().catch((e) => parentPort.postMessage(String(e)));`;
  const results = await Promise.all([0, 1].map(() => new Promise((resolve, reject) => {
    const w = new Worker(code, { eval: true });
    w.once('message', resolve);
    w.once('error', reject);
  })));
  assert.deepStrictEqual(results, [[7, 8], [7, 8]]);
});

test('a worker thread ended with its group, store and operations open: the rest lives on', { timeout: 60000 }, async () => {
  // rank 1 on a worker, rank 0 here, over a store server here; the worker is
  // terminated while an allreduce waits for rank 0
  const server = new uvccl.StoreServer({ host: '127.0.0.1', port: 0 });
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    const uvccl = require(${JSON.stringify(path.join(ROOT, 'node'))});
    (async () => {
      const st = await uvccl.TCPStore.connect('127.0.0.1', workerData.port);
      const pg = await uvccl.initProcessGroup({ store: st, rank: 1, worldSize: 2, prefix: 'w' });
      await pg.allreduce(new Float32Array(4));
      const hs = new uvccl.HashStore();
      hs.get('never').catch(() => {});
      pg.allreduce(Float32Array.of(7, 7, 7, 7));
      parentPort.postMessage('waiting');
      setInterval(() => {}, 1000);
    })().catch((e) => parentPort.postMessage(String(e)));`;
  const w = new Worker(code, { eval: true, workerData: { port: server.port } });
  // listening from the start: the worker may say so before this thread's
  // allreduce has resolved, and a message nobody listens for is lost
  const waiting = new Promise((res) => w.once('message', res));
  const st = await uvccl.TCPStore.connect('127.0.0.1', server.port);
  const pg = await uvccl.initProcessGroup({ store: st, rank: 0, worldSize: 2, prefix: 'w' });
  await pg.allreduce(new Float32Array(4));
  assert.strictEqual(await waiting, 'waiting');
  await w.terminate();
  // the worker's rank left (aborted): this rank's next allreduce says so.
  // The worker's pending allreduce may have posted its part before it went
  // (shared-memory boxes: a posted part is kept, src/cpu/xport/shm_box.c),
  // and then this rank's first allreduce completes with it; the one after
  // it cannot. (An allreduce resolves to its array: map that to undefined.)
  const x = Float32Array.of(1, 1, 1, 1);
  let e = await pg.allreduce(x, { timeout: 20000 }).then(() => undefined, (err) => err);
  if (e === undefined) {
    assert.deepStrictEqual(Array.from(x), [8, 8, 8, 8], 'completed with the part rank 1 posted');
    e = await pg.allreduce(new Float32Array(4), { timeout: 20000 }).then(() => undefined, (err) => err);
  }
  assert.ok(e instanceof uvccl.PeerError && e.rank === 1, `${e && e.name}: ${e && e.message}`);
  assert.match(e.message, /Node\.js environment ended|rank 1/);
  await pg.destroy();
  await st.close();
  await server.close();
  // and workers terminated alone, five times over
  for (let i = 0; i < 5; i++) {
    const lone = new Worker(`
      const uvccl = require(${JSON.stringify(path.join(ROOT, 'node'))});
      uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 }).then((pg) => {
        pg.allreduce(new Float32Array(2));
        require('node:worker_threads').parentPort.postMessage('up');
        setInterval(() => {}, 1000);
      });`, { eval: true });
    await new Promise((res) => lone.once('message', res));
    await lone.terminate();
  }
});

test('the process ends by itself once its group is destroyed', () => {
  const script = `
    const uvccl = require('./node');
    uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 })
      .then(async (pg) => { await pg.allreduce(new Float64Array(2)); await pg.destroy(); console.log('ok'); });`;
  // from the repository root, as the README says
  const r = spawnSync(process.execPath, ['-e', script], { cwd: ROOT, timeout: 20000, encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stderr);
  assert.strictEqual(r.stdout.trim(), 'ok');
  assert.match(uvccl.uvVersion, /^1\.\d+\.\d+/);
  assert.strictEqual(uvccl.uvVersion, process.versions.uv, 'the addon runs on Node\'s own libuv');
});

test('npm install ./node into a project, offline, then a world of one from it', { timeout: 300000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'uvccl-npm-'));
  try {
    fs.writeFileSync(path.join(dir, 'package.json'), '{"name": "app", "version": "1.0.0", "private": true}');
    execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', path.join(ROOT, 'node')],
                 { cwd: dir, stdio: 'pipe', timeout: 280000 });
    const r = spawnSync(process.execPath, ['-e', `
      const uvccl = require('uvccl');
      uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 }).then(async (pg) => {
        const x = Float32Array.of(1.5); await pg.allreduce(x); await pg.destroy();
        console.log(x[0], require.resolve('uvccl'));
      });`], { cwd: dir, timeout: 20000, encoding: 'utf8' });
    assert.strictEqual(r.status, 0, r.stderr);
    assert.match(r.stdout, /^1\.5 .*index\.js/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
