// pg-boss's side of bench/pgboss.py: one scenario in one Node process, printing one JSON line.
//
//   node bench/pgboss_driver.mjs MODULES SCENARIO URL QUEUE COUNT CONCURRENCY BATCH
//
// MODULES: the directory pg-boss was installed into (npm install --prefix MODULES pg-boss@V).
// SCENARIO: send (COUNT jobs, one send() per job), insert (COUNT jobs, BATCH per insert()),
// fill (insert COUNT jobs, not timed), drain (fetch BATCH + complete those ids until the queue
// is empty, then check every job was completed exactly once), count (the statements each call
// sends, counted at the driver). CONCURRENCY async loops share one PgBoss (pool max =
// CONCURRENCY). Only the loops are timed: start(), schema and queue creation are not.
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [modules, scenario, url, queue, ...numbers] = process.argv.slice(2);
const [count, concurrency, batch] = numbers.map(Number);
const requireThere = createRequire(join(modules, 'package.json'));
const { PgBoss } = await import(pathToFileURL(requireThere.resolve('pg-boss')).href);
const pg = requireThere('pg'); // the pg pg-boss's pool uses (one copy in MODULES)

// Every query a pg connection is given, counted (pg-boss sends each statement as one query).
const sent = [];
const realQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function (config, ...rest) {
  sent.push(typeof config === 'string' ? config : config?.text ?? '');
  return realQuery.call(this, config, ...rest);
};

// The payload queuelog's bench/data.py job_body carries.
const payload = (n) => ({ to: `user-${n}@example.com`, template: 'welcome-v2', locale: 'en-GB' });

const boss = new PgBoss({ connectionString: url, max: Math.max(concurrency, 2) });
boss.on('error', (error) => console.error(`pg-boss error: ${error.message}`));
await boss.start();
await boss.createQueue(queue);

// `loops` async loops each calling `step(loop)` until it returns 0 or `left` is used up; returns
// the jobs moved and the seconds taken.
async function timed(loops, step) {
  const began = performance.now();
  const moved = await Promise.all(Array.from({ length: loops }, async (_, loop) => {
    let jobs = 0;
    for (let n; (n = await step(loop)) > 0;) jobs += n;
    return jobs;
  }));
  return { jobs: moved.reduce((a, b) => a + b, 0), seconds: (performance.now() - began) / 1000 };
}

let calls = 0; // calls handed out to the loops, at most COUNT / per-call jobs
const budget = (per) => (calls++ < Math.ceil(count / per) ? per : 0);
const jobs = (n, first) => Array.from({ length: n }, (_, i) => ({ data: payload(first + i) }));

async function drain(size) {
  const seen = new Map();
  const result = await timed(concurrency, async () => {
    const fetched = await boss.fetch(queue, { batchSize: size });
    if (fetched.length === 0) return 0;
    for (const job of fetched) seen.set(job.id, (seen.get(job.id) ?? 0) + 1);
    await boss.complete(queue, fetched.map((job) => job.id));
    return fetched.length;
  });
  const { rows } = await boss.getDb().executeSql(
    'SELECT state, count(*)::int AS n FROM pgboss.job WHERE name = $1 GROUP BY state', [queue]);
  const states = Object.fromEntries(rows.map((row) => [row.state, row.n]));
  const twice = [...seen.values()].filter((times) => times > 1).length;
  return { ...result, distinct: seen.size, twice, states };
}

// The statements each call sends, after one warm-up cycle; `idle`: what pg-boss sends by
// itself (its supervisor, timekeeper, registry) in 2 s of nothing asked.
async function countStatements() {
  const measure = async (call) => {
    const before = sent.length;
    await call();
    return sent.slice(before).map((sql) => sql.replace(/\s+/g, ' ').trim().slice(0, 100));
  };
  await boss.insert(queue, jobs(2, 0));
  for (const job of await boss.fetch(queue, { batchSize: 2 })) await boss.complete(queue, job.id);
  const counts = {};
  counts.send = await measure(() => boss.send(queue, payload(0)));
  counts[`insert ${batch}`] = await measure(() => boss.insert(queue, jobs(batch, 0)));
  let one;
  counts.fetch = await measure(async () => { [one] = await boss.fetch(queue); });
  counts.complete = await measure(() => boss.complete(queue, one.id));
  let many;
  counts['fetch 100'] = await measure(async () => { many = await boss.fetch(queue, { batchSize: 100 }); });
  counts['complete 100'] = await measure(() => boss.complete(queue, many.map((job) => job.id)));
  counts['idle 2 s'] = await measure(() => new Promise((resolve) => setTimeout(resolve, 2000)));
  return { statements: counts };
}

let out;
if (scenario === 'send') {
  out = await timed(concurrency, async (loop) => (budget(1) ? (await boss.send(queue, payload(loop)), 1) : 0));
} else if (scenario === 'insert') {
  out = await timed(concurrency, async (loop) => {
    const n = budget(batch);
    if (n) await boss.insert(queue, jobs(n, loop));
    return n;
  });
} else if (scenario === 'fill') {
  for (let done = 0; done < count; done += 1000) await boss.insert(queue, jobs(Math.min(1000, count - done), done));
  out = { jobs: count };
} else if (scenario === 'drain') {
  out = await drain(batch);
} else if (scenario === 'count') {
  out = await countStatements();
} else {
  throw new Error(`unknown scenario ${scenario}`);
}
const connections = boss.getDb().pool?.totalCount; // the pool's connections at the end
await boss.stop({ graceful: false, wait: true });
console.log(JSON.stringify({ ...out, connections, node: process.version, pgboss: requireThere('pg-boss/package.json').version }));
