'use strict';
// uvccl-vsearch on Node.js: nearest-neighbour search (L2) over a synthetic
// table sharded across the ranks of a uvccl world, served over HTTP by rank
// 0 with node:http, on the very loop that runs the collectives.
//
//   uvccl-run -n 2 node examples/node/vsearch.js --port 8080
//   curl -d '{"vector": [0.1, ...], "k": 5}' localhost:8080/search
//
// Rank 0 batches the searches that arrive within a millisecond (up to
// --batch), broadcasts the batch, every rank finds its shard's k nearest
// rows, and an allgather brings them to rank 0, which merges them. When a
// rank fails, the searches in flight and every later one get 503 with
// uvccl's message naming the rank; /healthz keeps answering (the loop is
// alive) and says which rank failed.
const http = require('node:http');
const path = require('node:path');
const { parseArgs } = require('node:util');
const uvccl = require(path.join(__dirname, '..', '..', 'node'));

// The whole table, rows x dim float32 (every rank makes it, keeps its
// shard): a seeded generator, so that any process can check the answers.
function table(rows, dim, seed) {
  let s = seed >>> 0 || 1;
  const next = () => { // xorshift32, to (0, 1)
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return (s + 0.5) / 4294967296;
  };
  const t = new Float32Array(rows * dim);
  for (let i = 0; i < t.length; i++) t[i] = next() * 2 - 1;
  return t;
}

const shardBounds = (rows, rank, size) =>
  [Math.floor((rows * rank) / size), Math.floor((rows * (rank + 1)) / size)];

// The k nearest rows of one shard to a query: [distance, id] pairs, nearest
// first, ties by id.
function nearest(shard, dim, firstId, q, k) {
  const n = shard.length / dim, hits = [];
  for (let r = 0; r < n; r++) {
    let d = 0;
    for (let j = 0; j < dim; j++) {
      const x = shard[r * dim + j] - q[j];
      d += x * x;
    }
    hits.push([Math.fround(d), firstId + r]);
  }
  hits.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  return hits.slice(0, k);
}

class Search {
  constructor(pg, o) {
    this.pg = pg;
    this.o = o;
    const [lo, hi] = shardBounds(o.rows, pg.rank, pg.size);
    this.shard = table(o.rows, o.dim, o.seed).subarray(lo * o.dim, hi * o.dim);
    this.first = lo;
    this.queue = [];
    this.failed = null;
    this.wake = null;
  }

  // One batch on every rank: rank 0 passes its queries (n x dim), the
  // others null; the distances and ids of every shard at rank 0 (size x n
  // x maxK), or null at the end.
  async batch(queries) {
    const { pg, o } = this;
    const hdr = BigInt64Array.of(BigInt(queries ? queries.length / o.dim : 0));
    await pg.broadcast(hdr, { src: 0 });
    const n = Number(hdr[0]);
    if (n <= 0) return null;
    const q = queries || new Float32Array(n * o.dim);
    await pg.broadcast(q, { src: 0 });
    const dist = new Float32Array(n * o.maxK).fill(Infinity);
    const ids = new BigInt64Array(n * o.maxK).fill(-1n);
    for (let j = 0; j < n; j++) {
      nearest(this.shard, o.dim, this.first, q.subarray(j * o.dim, (j + 1) * o.dim), o.maxK)
        .forEach(([d, id], h) => { dist[j * o.maxK + h] = d; ids[j * o.maxK + h] = BigInt(id); });
    }
    const allD = new Float32Array(pg.size * n * o.maxK);
    const allI = new BigInt64Array(pg.size * n * o.maxK);
    await Promise.all([pg.allgather(allD, dist), pg.allgather(allI, ids)]);
    return { n, allD, allI };
  }

  async follower() {
    for (;;) {
      try {
        if ((await this.batch(null)) === null) return;
      } catch (e) {
        console.log(`rank ${this.pg.rank}: ${e.message}`);
        return;
      }
    }
  }

  async leader() {
    const { o } = this;
    for (;;) {
      if (this.queue.length === 0) await new Promise((res) => (this.wake = res));
      if (this.stopping && this.queue.length === 0) {
        if (!this.failed) await this.batch(new Float32Array(0));
        return;
      }
      await new Promise((res) => setTimeout(res, 1)); // gather a batch
      const items = this.queue.splice(0, o.batch);
      if (this.failed) {
        items.forEach((it) => it.reject(this.failed));
        continue;
      }
      const qs = new Float32Array(items.length * o.dim);
      items.forEach((it, j) => qs.set(it.vector, j * o.dim));
      let res;
      try {
        res = await this.batch(qs);
      } catch (e) {
        this.failed = e;
        items.forEach((it) => it.reject(e));
        continue;
      }
      items.forEach((it, j) => {
        const hits = [];
        for (let r = 0; r < this.pg.size; r++)
          for (let h = 0; h < o.maxK; h++) {
            const at = (r * res.n + j) * o.maxK + h;
            if (res.allI[at] >= 0n) hits.push([res.allD[at], Number(res.allI[at])]);
          }
        hits.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
        it.resolve(hits.slice(0, it.k).map(([d, id]) => ({ id, distance: d })));
      });
    }
  }

  search(vector, k) {
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => {
      this.queue.push({ vector, k, resolve, reject });
      if (this.wake) { const w = this.wake; this.wake = null; w(); }
    });
  }

  stop() {
    this.stopping = true;
    if (this.wake) { const w = this.wake; this.wake = null; w(); }
  }
}

function reply(res, status, body) {
  const s = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(s) });
  res.end(s);
}

async function serve(o) {
  const pg = await uvccl.initProcessGroup('env://');
  const s = new Search(pg, o);
  if (pg.rank !== 0) {
    await s.follower();
    await pg.destroy();
    return;
  }
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/healthz') {
      return reply(res, 200, s.failed
        ? { status: 'degraded', failed_rank: s.failed.rank, error: s.failed.message }
        : { status: 'ok', ranks: pg.size });
    }
    if (req.method !== 'POST' || req.url !== '/search') return reply(res, 404, { error: 'not found' });
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      let vector, k;
      try {
        const body = JSON.parse(Buffer.concat(chunks).toString());
        k = body.k === undefined ? 10 : body.k;
        if (!Array.isArray(body.vector) || body.vector.length !== o.dim ||
            !body.vector.every(Number.isFinite) || !Number.isInteger(k) || k < 1 || k > o.maxK)
          throw new Error(`a vector of ${o.dim} numbers and 1 <= k <= ${o.maxK}`);
        vector = Float32Array.from(body.vector);
      } catch (e) {
        return reply(res, 400, { error: e.message });
      }
      try {
        reply(res, 200, { results: await s.search(vector, k) });
      } catch (e) {
        if (!(e instanceof uvccl.UvcclError)) throw e;
        reply(res, 503, { error: e.message, failed_rank: e.rank });
      }
    });
  });
  await new Promise((res) => server.listen(o.port, o.host, res));
  console.log(`listening on ${o.host}:${server.address().port}`);
  const leader = s.leader();
  await new Promise((res) => {
    process.once('SIGINT', res);
    process.once('SIGTERM', res);
  });
  s.stop();
  await leader;
  server.close();
  server.closeAllConnections();
  await pg.destroy();
}

if (require.main === module) {
  const { values } = parseArgs({
    options: {
      port: { type: 'string', default: '0' }, host: { type: 'string', default: '127.0.0.1' },
      dim: { type: 'string', default: '64' }, rows: { type: 'string', default: '20000' },
      seed: { type: 'string', default: '1' }, 'max-k': { type: 'string', default: '10' },
      batch: { type: 'string', default: '32' },
    },
  });
  serve({
    port: Number(values.port), host: values.host, dim: Number(values.dim),
    rows: Number(values.rows), seed: Number(values.seed), maxK: Number(values['max-k']),
    batch: Number(values.batch),
  }).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { table, nearest, shardBounds };
