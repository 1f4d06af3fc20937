'use strict';
// The addon under valgrind (where it is installed): every kind of call
// once in one process, the failing ones too (ranks.js local_all), with no
// invalid access and nothing definitely lost whose allocation the addon or
// uvccl made. (Node itself is run --jitless, which valgrind follows.)
const { test } = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const have = spawnSync('valgrind', ['--version']).status === 0;

test('valgrind: no invalid access, no leak of the addon\'s', { skip: !have && 'no valgrind', timeout: 300000 }, () => {
  const r = spawnSync('valgrind', ['--leak-check=full', '--show-leak-kinds=definite',
                                   process.execPath, '--jitless', path.join(__dirname, 'ranks.js'), 'local_all'],
                      { encoding: 'utf8', timeout: 280000 });
  assert.strictEqual(r.status, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /^ok local_all$/m, r.stdout);
  assert.match(r.stdout, /^ok rejects$/m, r.stdout);
  const err = r.stderr;
  assert.doesNotMatch(err, /Invalid (read|write|free)|uninitialised|Mismatched free/, err);
  // each loss record, as a block of lines: none through the addon
  const records = err.split(/\n==\d+== \n/).filter((b) => /definitely lost in loss record/.test(b));
  const ours = records.filter((b) => /uvccl|Napi::|napi_/.test(b));
  assert.deepStrictEqual(ours, [], ours.join('\n\n'));
});
