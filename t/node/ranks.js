'use strict';
// One rank of a test world of the Node.js addon (world.test.js starts them:
// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set). argv[2] names the
// scenario. Each check prints "ok NAME" or "not ok NAME: why"; the test
// compares what every rank printed.
const path = require('path');
const uvccl = require(path.join(__dirname, '..', '..', 'node'));

let failures = 0;
function check(name, cond, why) {
  if (cond) {
    console.log('ok ' + name);
  } else {
    failures++;
    console.log('not ok ' + name + ': ' + (why === undefined ? '' : JSON.stringify(why, replacer)));
  }
}
function replacer(k, v) { return typeof v === 'bigint' ? v.toString() : v; }
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
const eq = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const range = (n) => Array.from({ length: n }, (_, i) => i);

// Every TypedArray that names a dtype, with values that stay exact.
const TYPES = [Float32Array, Float64Array, Int32Array, Int8Array, Uint8Array, BigInt64Array];
const cast = (T, x) => (T === BigInt64Array ? BigInt(x) : x);
function inputs(T, r, n = 37) {
  return T.from(range(n), (i) => cast(T, (i % 5) + r + 1));
}
function localReduce(T, op, size) {
  const f = { sum: (a, b) => a + b, max: (a, b) => (a > b ? a : b),
              min: (a, b) => (a < b ? a : b), product: (a, b) => a * b }[op];
  const acc = inputs(T, 0);
  for (let r = 1; r < size; r++) {
    const v = inputs(T, r);
    for (let i = 0; i < acc.length; i++) acc[i] = f(acc[i], v[i]);
  }
  return Array.from(acc);
}

async function collectives(pg) {
  const r = pg.rank, n = pg.size;
  const bad = [];
  for (const T of TYPES) {
    for (const op of ['sum', 'max', 'min', 'product']) {
      if ((T === Int8Array || T === Uint8Array) && op === 'product') continue;
      const a = inputs(T, r);
      const got = await pg.allreduce(a, { op });
      if (got !== a || !eq(Array.from(a), localReduce(T, op, n))) bad.push(T.name + '/' + op);
    }
  }
  check('allreduce_dtypes', bad.length === 0, bad);
  const avg = new Float64Array(10).fill(r);
  await pg.allreduce(avg, 'avg');
  check('allreduce_avg', avg.every((x) => x === (n - 1) / 2), Array.from(avg.slice(0, 3)));
  const b = Buffer.alloc(8, r);
  await pg.allreduce(b, 'max');
  check('allreduce_buffer', b.every((x) => x === n - 1), Array.from(b));
  // a view into a larger ArrayBuffer, at an offset: only the view moves
  const ab = new ArrayBuffer(64);
  const view = new Int32Array(ab, 16, 4).fill(r + 1);
  new Int32Array(ab, 0, 4).fill(-7);
  await pg.allreduce(view);
  check('allreduce_offset_view', view.every((x) => x === (n * (n + 1)) / 2) &&
        new Int32Array(ab, 0, 4).every((x) => x === -7), Array.from(new Int32Array(ab)));
  const big = Float32Array.from({ length: 1 << 20 }, (_, i) => i + r);
  await pg.allreduce(big);
  check('allreduce_4MiB', big.every((x, i) => x === i * n + (n * (n - 1)) / 2));
  // bfloat16 in a Uint16Array: the top halves of float32s
  const f = new Float32Array(4).fill(r + 1);
  const bf = Uint16Array.from(new Uint32Array(f.buffer), (u) => u >>> 16);
  await pg.allreduce(bf, { dtype: 'bfloat16' });
  const back = new Float32Array(Uint32Array.from(bf, (h) => h << 16).buffer);
  check('allreduce_bfloat16', back.every((x) => x === (n * (n + 1)) / 2), Array.from(back));
  // broadcast from every root, reduce to every root
  let ok = true;
  for (let root = 0; root < n; root++) {
    const x = r === root ? BigInt64Array.from(range(100), (i) => BigInt(i * (r + 1)))
                         : new BigInt64Array(100);
    await pg.broadcast(x, { src: root });
    ok = ok && x.every((v, i) => v === BigInt(i * (root + 1)));
  }
  check('broadcast_roots', ok);
  ok = true;
  for (let root = 0; root < n; root++) {
    const x = new Int32Array(7).fill(r + 1);
    await pg.reduce(x, { dst: root, op: 'sum' });
    if (r === root) ok = ok && x.every((v) => v === (n * (n + 1)) / 2);
  }
  check('reduce_roots', ok);
  let out = new Float64Array(n * 3);
  await pg.allgather(out, new Float64Array(3).fill(r));
  check('allgather', eq(Array.from(out), range(n * 3).map((i) => Math.floor(i / 3))), Array.from(out));
  const rsIn = BigInt64Array.from(range(n * 4), (i) => BigInt(i + r));
  const rsOut = new BigInt64Array(4);
  await pg.reduceScatter(rsOut, rsIn);
  check('reduce_scatter', rsOut.every((v, i) => v === BigInt((r * 4 + i) * n + (n * (n - 1)) / 2)),
        Array.from(rsOut));
  // alltoall: block j of rank i holds 100 i + j
  const aIn = Int32Array.from(range(n * 2), (i) => 100 * r + Math.floor(i / 2));
  const aOut = new Int32Array(n * 2);
  await pg.alltoall(aOut, aIn);
  check('alltoall', aOut.every((v, i) => v === Math.floor(i / 2) * 100 + r), Array.from(aOut));
  // gather and scatter at the last rank
  const root = n - 1;
  const g = r === root ? new Float32Array(n * 2) : null;
  const gr = await pg.gather(new Float32Array(2).fill(r), g, { dst: root });
  check('gather', r !== root ? gr === null : gr === g && g.every((v, i) => v === Math.floor(i / 2)),
        g && Array.from(g));
  const s = new BigInt64Array(2);
  await pg.scatter(s, r === root ? BigInt64Array.from(range(n * 2), (i) => BigInt(3 * Math.floor(i / 2))) : null,
                   { src: root });
  check('scatter', s.every((v) => v === BigInt(3 * r)), Array.from(s));
  await pg.barrier();
  check('barrier', true);
  await pg.monitoredBarrier({ waitAll: true, timeout: 30000 });
  check('monitored_barrier', true);
  // the uneven and many-buffer variants
  const bufs = [new Float32Array(3).fill(r), new Float32Array(5).fill(r + 1)];
  await pg.allreduceCoalesced(bufs);
  check('allreduce_coalesced', bufs[0].every((v) => v === (n * (n - 1)) / 2) &&
        bufs[1].every((v) => v === (n * (n + 1)) / 2), bufs.map((x) => Array.from(x)));
  const outs = range(n).map((i) => new Int32Array(i + 1));
  await pg.allgatherv(outs, new Int32Array(r + 1).fill(r));
  check('allgatherv', outs.every((o, i) => o.length === i + 1 && o.every((v) => v === i)),
        outs.map((x) => Array.from(x)));
  const counts = range(n).map((i) => i + 1);
  const total = counts.reduce((a, c) => a + c, 0);
  const vIn = Float64Array.from(range(total), (i) => i + r);
  const vOut = new Float64Array(r + 1);
  await pg.reduceScatterv(vOut, vIn, counts);
  const lo = counts.slice(0, r).reduce((a, c) => a + c, 0);
  check('reduce_scatterv', vOut.every((v, i) => v === (lo + i) * n + (n * (n - 1)) / 2), Array.from(vOut));
  const tIn = BigInt64Array.from([].concat(...range(n).map((j) => Array(j + 1).fill(10 * r + j))), BigInt);
  const tOut = new BigInt64Array(n * (r + 1));
  await pg.alltoallv(tOut, tIn, range(n).map((j) => j + 1), Array(n).fill(r + 1));
  check('alltoallv', tOut.every((v, i) => v === BigInt(Math.floor(i / (r + 1)) * 10 + r)), Array.from(tOut));
  // point to point around the ring, and from any source
  const msg = new Uint8Array(16).fill(r);
  const rbuf = new Uint8Array(64);
  const sent = pg.send(msg, (r + 1) % n, { tag: 5 });
  const got = await pg.recv(rbuf, { src: (r - 1 + n) % n, tag: 5 });
  await sent;
  check('send_recv', got.source === (r - 1 + n) % n && got.length === 16 &&
        rbuf.subarray(0, 16).every((v) => v === (r - 1 + n) % n), got);
  if (r === 0) {
    const seen = new Set();
    for (let i = 1; i < n; i++) {
      const { source, length } = await pg.recv(rbuf, { src: -1, tag: 9 });
      seen.add(source + ':' + Buffer.from(rbuf.subarray(0, length)).toString());
    }
    check('recv_any', eq([...seen].sort(), range(n - 1).map((i) => `${i + 1}:from ${i + 1}`).sort()), [...seen]);
  } else {
    await pg.send(Buffer.from('from ' + r), 0, { tag: 9 });
    check('recv_any', true);
  }
  // byte payloads and objects of different sizes across ranks
  const bb = await pg.broadcastBytes(r === 1 ? Buffer.from('from one') : null, { src: 1 });
  check('broadcast_bytes', bb.toString() === 'from one', bb.toString());
  const ab2 = await pg.allgatherBytes(Buffer.alloc(r + 1, r));
  check('allgather_bytes', ab2.length === n && ab2.every((b, i) => b.length === i + 1 && b.every((v) => v === i)),
        ab2.map((b) => [...b]));
  const gb = await pg.gatherBytes(Buffer.from('r' + r), { dst: 0 });
  check('gather_bytes', r === 0 ? gb.map(String).join() === range(n).map((i) => 'r' + i).join() : gb === null,
        gb && gb.map(String));
  const sb = await pg.scatterBytes(r === 0 ? range(n).map((i) => Buffer.alloc(i * 3, i)) : null, { src: 0 });
  check('scatter_bytes', sb.length === r * 3 && sb.every((v) => v === r), [...sb]);
  const obj = await pg.broadcastObject(r === 0 ? { a: [1, 2], m: new Map([['k', 3n]]), f: Float32Array.of(0.5) } : null);
  check('broadcast_object', obj.a[1] === 2 && obj.m.get('k') === 3n && obj.f[0] === 0.5, obj);
  const objs = await pg.allGatherObject({ rank: r, s: 'x'.repeat(r) });
  check('all_gather_object', objs.every((x, i) => x.rank === i && x.s.length === i), objs);
  const mine = await pg.scatterObject(r === n - 1 ? range(n).map((i) => [i, 'to ' + i]) : null, { src: n - 1 });
  check('scatter_object', mine[0] === r && mine[1] === 'to ' + r, mine);
  const gob = await pg.gatherObject(r * 10, { dst: n - 1 });
  check('gather_object', r === n - 1 ? eq(gob, range(n).map((i) => i * 10)) : gob === null, gob);
  // batch_isend_irecv around the ring, both ways at once
  const toR = new Int32Array(4).fill(r), toL = new Int32Array(2).fill(-r);
  const fromL = new Int32Array(4), fromR = new Int32Array(2);
  const res = await pg.batchIsendIrecv([
    { op: 'isend', buf: toR, peer: (r + 1) % n, tag: 3 }, { op: 'irecv', buf: fromL, peer: (r - 1 + n) % n, tag: 3 },
    { op: 'isend', buf: toL, peer: (r - 1 + n) % n, tag: 4 }, { op: 'irecv', buf: fromR, peer: (r + 1) % n, tag: 4 },
  ]);
  check('batch_isend_irecv', res[0] === null && res[1].source === (r - 1 + n) % n && res[1].length === 16 &&
        fromL.every((v) => v === (r - 1 + n) % n) && fromR.every((v) => v === -((r + 1) % n)), res);
  // premul_sum: each input times a factor, then the sum
  const pm = new Float64Array(3).fill(r + 1);
  await pg.allreduce(pm, { op: pg.premulSum(0.5) });
  check('premul_sum', pm.every((v) => v === (n * (n + 1)) / 4), Array.from(pm));
  // many in flight at once
  const xs = range(20).map((i) => BigInt64Array.from([i + r, i + r, i + r], BigInt));
  await Promise.all(xs.map((x) => pg.allreduce(x)));
  check('concurrent', xs.every((x, i) => x.every((v) => v === BigInt(n * i + (n * (n - 1)) / 2))));
  // subgroups
  const sub = await pg.split(r % 2);
  const x = BigInt64Array.of(BigInt(r));
  await sub.allreduce(x);
  const mates = range(n).filter((i) => i % 2 === r % 2);
  check('split', x[0] === BigInt(mates.reduce((a, c) => a + c, 0)) && sub.size === mates.length,
        [x[0], sub.size]);
  await sub.destroy();
  const ng = pg.newGroup([0, 1]);
  if (r < 2) {
    const y = BigInt64Array.of(BigInt(r + 10));
    await ng.allreduce(y);
    check('new_group', y[0] === 21n && ng.rank === r && ng.size === 2, y[0]);
    await ng.destroy();
  } else {
    check('new_group', ng === null, ng);
  }
  const none = await pg.split(r === 0 ? -1 : 0);
  check('split_none', r === 0 ? none === null : none.size === n - 1, none && none.size);
  if (none !== null) await none.destroy();
  const fr = uvccl.flightRecorder('test');
  const ops = new Set((fr.entries || []).map((e) => e.op));
  check('flight_recorder', ['allreduce', 'broadcast', 'allgather'].every((o) => ops.has(o)), [...ops].slice(0, 10));
}

async function storeOps() {
  const r = Number(process.env.RANK), n = Number(process.env.WORLD_SIZE);
  const st = await uvccl.TCPStore.connect(process.env.MASTER_ADDR, Number(process.env.MASTER_PORT));
  await st.set('js/k' + r, 'v' + r);
  const vals = [];
  for (let i = 0; i < n; i++) vals.push((await st.get('js/k' + i)).toString());
  check('store_get', eq(vals, range(n).map((i) => 'v' + i)), vals);
  const cnt = await st.add('js/counter', 1);
  await st.wait(range(n).map((i) => 'js/k' + i));
  check('store_add', cnt >= 1 && cnt <= n, cnt);
  check('store_check', (await st.check(['js/k0'])) && !(await st.check(['js/nope'])));
  try {
    st.setTimeout(200);
    await st.get('js/never');
    check('store_timeout', false, 'no error');
  } catch (e) {
    check('store_timeout', e instanceof uvccl.TimeoutError && e.errno < 0, e.message);
  }
  await st.close();
}

const scenarios = {
  // One process, every kind of call once, the failing ones too (for
  // valgrind: valgrind.test.js).
  async local_all() {
    const st = new uvccl.HashStore();
    const pg = await uvccl.initProcessGroup({ store: st, rank: 0, worldSize: 1 });
    const a = new Float32Array(1000).fill(2);
    for (let i = 0; i < 20; i++) await pg.allreduce(a, 'max');
    await pg.allgather(new Float64Array(4), Float64Array.of(1, 2, 3, 4));
    const rejects = await Promise.all([
      pg.allreduce('bad'), pg.allgather(new Float32Array(3), new Float32Array(4)),
      pg.alltoallv(a, a, [3], [4]), pg.broadcast(a, { src: 3 }), pg.allreduce(a, { timeout: -1 }),
      pg.split('x'), st.set(1, 2), uvccl.initProcessGroup({ store: {}, rank: 0, worldSize: 1 }),
    ].map((p) => p.then(() => 0, () => 1)));
    check('rejects', rejects.every((x) => x === 1), rejects);
    const outs = [new Int32Array(2)];
    await pg.allgatherv(outs, Int32Array.of(5, 6));
    await pg.allreduceCoalesced([new Float32Array(3), new Float64Array(2)]).catch(() => {});
    const half = Float64Array.of(4);
    await pg.allreduce(half, { op: pg.premulSum(0.5) });
    // (point-to-point with itself: refused)
    const got = await pg.batchIsendIrecv([{ op: 'send', buf: Int32Array.of(9), peer: 0 },
                                          { op: 'recv', buf: new Int32Array(1), peer: 0 }])
      .catch((e) => e);
    const objs = await pg.allGatherObject({ k: [1, 2] });
    check('local_more', half[0] === 2 && got instanceof uvccl.InvalidArgumentError && objs[0].k[1] === 2 &&
          (await pg.broadcastBytes(Buffer.from('b'))).toString() === 'b', [half[0], got, objs]);
    const sub = await pg.split(0);
    await sub.destroy();
    await st.set('k', 'v');
    await st.get('k');
    await st.wait(['zz'], { timeout: 20 }).catch(() => {});
    const srv = new uvccl.StoreServer({ port: 0 });
    const c = await uvccl.TCPStore.connect('127.0.0.1', srv.port);
    await c.set('a', 'b');
    check('local_all', (await c.get('a')).toString() === 'b' && outs[0][1] === 6 && a[0] === 2);
    await c.close();
    await srv.close();
    await pg.destroy();
    await st.close();
  },

  async collectives() {
    const pg = await uvccl.initProcessGroup('env://');
    check('init', pg.size === Number(process.env.WORLD_SIZE) && pg.rank === Number(process.env.RANK));
    await collectives(pg);
    await storeOps();
    await pg.barrier();
    await pg.destroy();
    check('destroy', true);
  },

  // The last rank SIGKILLs itself while 64 MiB allreduces run; the others
  // get PeerError naming it, their loop keeps serving a timer, later calls
  // fail the same way, and they shrink and go on.
  async kill() {
    const pg = await uvccl.initProcessGroup('env://');
    const r = pg.rank, n = pg.size, victim = n - 1;
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 1);
    const big = new Float32Array(16 << 20).fill(1);
    await pg.allreduce(new Float32Array(4));
    if (r === victim) setTimeout(() => process.kill(process.pid, 'SIGKILL'), 20);
    try {
      for (let i = 0; i < 50; i++) await pg.allreduce(big);
      check('peer_error', false, 'no error');
    } catch (e) {
      check('peer_error', e instanceof uvccl.PeerError && e.rank === victim &&
            e.message.includes('rank ' + victim) &&
            ['exited', 'reset', 'heartbeat'].includes(e.failure.cause), [e.name, e.rank, e.message]);
    }
    const before = ticks;
    await sleep(50);
    check('loop_alive', ticks > before, [before, ticks]);
    try {
      await pg.allreduce(new Float32Array(4));
      check('later_call', false, 'no error');
    } catch (e) {
      check('later_call', e instanceof uvccl.PeerError && e.rank === victim, e.message);
    }
    check('failure', pg.failure() && pg.failure().rank === victim, pg.failure());
    const small = await pg.shrink();
    const x = BigInt64Array.of(BigInt(r));
    await small.allreduce(x);
    check('shrink', small.size === n - 1 && x[0] === BigInt(((n - 1) * (n - 2)) / 2), [small.size, x[0]]);
    clearInterval(ticker);
    await small.destroy();
    await pg.destroy();
  },

  // Wrong sizes across ranks: with the fingerprint check (UVCCL_DEBUG=
  // detail) every rank gets MismatchError naming both counts.
  async mismatch() {
    const pg = await uvccl.initProcessGroup('env://');
    try {
      await pg.allreduce(new Float32Array(10 + pg.rank), { timeout: 20000 });
      check('mismatch', false, 'no error');
    } catch (e) {
      check('mismatch', e instanceof uvccl.MismatchError && e.message.includes('10') &&
            e.message.includes('11'), e.message);
    }
    await pg.destroy();
  },

  // Rank 0 waits for an allreduce that rank 1 never starts: TimeoutError,
  // and rank 1 hears of it naming itself; then rank 1 revokes another
  // group: RevokedError with the reason on both.
  async timeout_revoke() {
    const pg = await uvccl.initProcessGroup('env://');
    const r = pg.rank;
    const st = await uvccl.TCPStore.connect(process.env.MASTER_ADDR, Number(process.env.MASTER_PORT));
    if (r === 0) {
      const t0 = Date.now();
      try {
        await pg.allreduce(new Float32Array(4), { timeout: 300 });
        check('timeout', false, 'no error');
      } catch (e) {
        const dt = Date.now() - t0;
        check('timeout', e instanceof uvccl.TimeoutError && dt > 250 && dt < 5000, [dt, e.message]);
      }
      await st.set('js/timed_out', '1');
    } else {
      await st.wait(['js/timed_out']);
      check('timeout', true);
    }
    if (r === 1) {
      try {
        await pg.barrier({ timeout: 20000 });
        check('after_timeout', false, 'no error');
      } catch (e) {
        check('after_timeout', e instanceof uvccl.PeerError && e.rank === 1 &&
              e.failure.reporter === 0 && e.failure.cause === 'timeout' &&
              e.message.includes('timed out'), [e.failure, e.message]);
      }
    } else {
      check('after_timeout', pg.failure() !== null, pg.failure());
    }
    const pg2 = await uvccl.initProcessGroup({ store: st, rank: r, worldSize: 2, prefix: 'js/revoke' });
    await pg2.barrier();
    if (r === 1) pg2.revoke('test over');
    try {
      await pg2.barrier({ timeout: 20000 });
      check('revoked', false, 'no error');
    } catch (e) {
      check('revoked', e instanceof uvccl.RevokedError && e.message.includes('test over'), [e.name, e.message]);
    }
    await pg2.destroy();
    await st.close();
    await pg.destroy();
  },

  // Rank 0 aborts while waiting in an allreduce rank 1 never joins:
  // AbortedError there, PeerError naming rank 0 (cause aborted) here.
  async abort() {
    const pg = await uvccl.initProcessGroup('env://');
    if (pg.rank === 0) {
      const pending = pg.allreduce(new Float32Array(4));
      await sleep(50);
      pg.abort('shutting down');
      try {
        await pending;
        check('aborted_here', false, 'no error');
      } catch (e) {
        check('aborted_here', e instanceof uvccl.AbortedError, [e.name, e.message]);
      }
      check('aborted_peer', true);
    } else {
      check('aborted_here', true);
      await sleep(500);
      try {
        await pg.allreduce(new Float32Array(4), { timeout: 20000 });
        await pg.allreduce(new Float32Array(4), { timeout: 20000 });
        check('aborted_peer', false, 'no error');
      } catch (e) {
        check('aborted_peer', e instanceof uvccl.PeerError && e.rank === 0 &&
              e.failure.cause === 'aborted' && e.message.includes('shutting down'), [e.failure, e.message]);
      }
    }
    await pg.destroy();
  },

  // tcp:// and a store object, rank 0 serving a StoreServer itself.
  async init_store() {
    const r = Number(process.env.RANK), n = Number(process.env.WORLD_SIZE);
    const port = Number(process.env.MASTER_PORT);
    let server = null;
    if (r === 0) {
      server = new uvccl.StoreServer({ host: '127.0.0.1', port });
      check('server', server.port === port, server.port);
    }
    const st = await uvccl.TCPStore.connect('127.0.0.1', port, { timeout: 30000 });
    const pg = await uvccl.initProcessGroup({ store: st, rank: r, worldSize: n, prefix: 'js/store' });
    const x = BigInt64Array.of(BigInt(r + 1));
    await pg.allreduce(x);
    check('init_store', x[0] === BigInt((n * (n + 1)) / 2), x[0]);
    const pg2 = await uvccl.initProcessGroup(`tcp://127.0.0.1:${port}`, { rank: r, worldSize: n, prefix: 'js/url' });
    await pg2.allreduce(x);
    check('init_tcp_url', x[0] === BigInt((n * n * (n + 1)) / 2), x[0]);
    await pg2.destroy();
    await pg.barrier();
    await pg.destroy();
    await st.close();
    if (server) await server.close();
  },
};

scenarios[process.argv[2]]().then(() => {
  console.log('done');
  process.exitCode = failures ? 1 : 0;
}, (e) => {
  // exit now: an open group, like a server, would keep the process alive
  console.log('not ok uncaught: ' + (e && e.stack));
  process.exit(1);
});
