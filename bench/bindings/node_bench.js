'use strict';
// The Node.js addon's figures (bench/bindings/run.sh runs it under
// uvccl-run, env://). Modes:
//   chain [SIZES...]   back-to-back allreduces (Float32Array, in place), each
//                      awaited before the next: "node SIZE ITERS US BUSBW" on
//                      rank 0, the same line as uvccl-bindings-chain's "c"
//   lag BACKEND MIB S  a 1 ms timer's lateness (p50, p99, max) and
//                      perf_hooks.monitorEventLoopDelay's p50/p99 (its
//                      1 ms resolution taken off: the lateness) while
//                      MIB-MiB allreduces run back to back for S seconds:
//                      BACKEND uvccl (awaited on the loop) or idle (no
//                      collectives: the floor)
// Each rank prints "lag node-BACKEND RANK p50_ms p99_ms max_ms ops
// op_ms_median eld_p50_ms eld_p99_ms".
//   floor              in one process: Node's own round trip through its
//                      loop (a Promise settled by setImmediate) against a
//                      4 B allreduce of a world of one (a uvccl completion
//                      on the next turn): "floor IMMEDIATE_US WORLD1_US"
const path = require('node:path');
const { monitorEventLoopDelay } = require('node:perf_hooks');
const uvccl = require(path.join(__dirname, '..', '..', 'node'));

const now = () => Number(process.hrtime.bigint()) / 1e6; // ms
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))] : 0;
};
const median = (xs) => pct(xs, 50);

async function chain(sizes) {
  const pg = await uvccl.initProcessGroup('env://');
  for (const size of sizes) {
    const x = new Float32Array(Math.max(1, size / 4));
    const iters = size <= 4096 ? 100000 : size <= 2 << 20 ? 400 : 30;
    // as many calls again first at 4 B: V8 compiles this loop's path only
    // after thousands of turns, and a server's is long compiled
    const warm = size <= 4096 ? 20000 : iters / 10;
    for (let i = 0; i < warm; i++) await pg.allreduce(x);
    const t = now();
    for (let i = 0; i < iters; i++) await pg.allreduce(x);
    const us = ((now() - t) / iters) * 1e3;
    const busbw = (x.byteLength * 2 * (pg.size - 1)) / pg.size / (us * 1e3);
    if (pg.rank === 0) console.log(`node ${x.byteLength} ${iters} ${us.toFixed(2)} ${busbw.toFixed(3)}`);
  }
  await pg.destroy();
}

async function lag(backend, mib, seconds) {
  const rank = Number(process.env.RANK);
  const x = new Float32Array(mib << 18).fill(1);
  let pg = null;
  if (backend === 'uvccl') {
    pg = await uvccl.initProcessGroup('env://');
    await pg.allreduce(x);
  }
  const lags = [];
  let stop = false;
  const ticker = (async () => {
    while (!stop) {
      const t = now();
      await new Promise((res) => setTimeout(res, 1));
      lags.push(now() - t - 1);
    }
  })();
  const eld = monitorEventLoopDelay({ resolution: 1 });
  await new Promise((res) => setTimeout(res, 100));
  lags.length = 0;
  eld.enable();
  const ops = [];
  const end = now() + seconds * 1e3;
  if (pg === null) {
    await new Promise((res) => setTimeout(res, seconds * 1e3));
  } else {
    // every rank runs the same number: rank 0's last op carries -1 in x[0]
    for (;;) {
      const t0 = now();
      x[0] = rank === 0 && now() > end ? -1 : 0;
      await pg.allreduce(x);
      ops.push(now() - t0);
      if (x[0] < 0) break;
    }
  }
  eld.disable();
  stop = true;
  await ticker;
  console.log(`lag node-${backend} ${rank} ${pct(lags, 50).toFixed(3)} ${pct(lags, 99).toFixed(3)} ` +
              `${Math.max(...lags).toFixed(3)} ${ops.length} ${(ops.length ? median(ops) : 0).toFixed(1)} ` +
              `${(eld.percentile(50) / 1e6 - 1).toFixed(3)} ${(eld.percentile(99) / 1e6 - 1).toFixed(3)}`);
  if (pg) await pg.destroy();
}

async function floor() {
  const n = 200000;
  let t = now();
  for (let i = 0; i < n; i++) await new Promise((res) => setImmediate(res));
  const immediate = ((now() - t) / n) * 1e3;
  const pg = await uvccl.initProcessGroup({ store: new uvccl.HashStore(), rank: 0, worldSize: 1 });
  const b = new Float32Array(1);
  for (let i = 0; i < n / 10; i++) await pg.allreduce(b);
  t = now();
  for (let i = 0; i < n; i++) await pg.allreduce(b);
  console.log(`floor ${immediate.toFixed(3)} ${(((now() - t) / n) * 1e3).toFixed(3)}`);
  await pg.destroy();
}

const [mode, ...rest] = process.argv.slice(2);
const units = { K: 1 << 10, M: 1 << 20 };
const run = mode === 'floor' ? floor() : mode === 'chain'
  ? chain(rest.length ? rest.map((s) => (units[s.slice(-1)] ? parseInt(s, 10) * units[s.slice(-1)] : Number(s)))
                      : [4, 1 << 20, 16 << 20])
  : lag(rest[0], Number(rest[1]), Number(rest[2]));
run.catch((e) => {
  console.error(e);
  process.exit(1);
});
