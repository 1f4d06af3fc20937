#!/usr/bin/env node
// Builds the addon (npm's install script, and make's): node-gyp against the
// headers of the very node that runs this, where they are installed beside
// it (Debian's and NodeSource's packages put them in <prefix>/include/node),
// so that nothing is downloaded and the addon is compiled against the uv.h
// and OpenSSL headers of the libuv and OpenSSL it will run against.
'use strict';
const fs = require('fs');
const path = require('path');
const { spawnSync } = require('child_process');

const here = path.resolve(__dirname, '..');
const root = path.resolve(here, '..');
if (!fs.existsSync(path.join(root, 'include', 'uvccl.h')) ||
    !fs.existsSync(path.join(root, 'src', 'pg', 'api.c'))) {
  console.error('uvccl: the addon builds from a uvccl checkout (it compiles ' +
                '../src); install it with `npm install <checkout>/node`');
  process.exit(1);
}

function nodeGyp() {
  const candidates = [
    path.join(here, 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'),
    process.env.npm_config_node_gyp,
    path.join(path.dirname(process.execPath), '..', 'lib', 'node_modules',
              'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js'),
  ];
  for (const c of candidates) if (c && fs.existsSync(c)) return c;
  try {
    return require.resolve('node-gyp/bin/node-gyp.js', { paths: [here] });
  } catch (e) {
    console.error('uvccl: node-gyp not found (npm install in node/ fetches it)');
    process.exit(1);
  }
}

const args = [nodeGyp(), 'rebuild', '--jobs', 'max'];
const prefix = path.resolve(path.dirname(process.execPath), '..');
if (fs.existsSync(path.join(prefix, 'include', 'node', 'common.gypi')) &&
    fs.existsSync(path.join(prefix, 'include', 'node', 'uv.h')))
  args.push('--nodedir=' + prefix);
// node-gyp runs make: not with the settings of a make that may be running
// this (make check SANITIZE=1 runs the npm install test)
const env = { ...process.env };
for (const k of ['MAKEFLAGS', 'MFLAGS', 'MAKELEVEL', 'MAKEOVERRIDES', 'SANITIZE']) delete env[k];
const r = spawnSync(process.execPath, args, { cwd: here, stdio: 'inherit', env });
process.exit(r.status === null ? 1 : r.status);
