// The C library's sources (../src/*/...c), for binding.gyp: the addon
// compiles the whole library against Node's own headers.
'use strict';
const fs = require('fs');
const path = require('path');
const src = path.resolve(__dirname, '..', '..', 'src');
const out = [];
(function walk(dir) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name < b.name ? -1 : 1)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p);
    else if (e.name.endsWith('.c')) out.push(path.relative(path.resolve(__dirname, '..'), p));
  }
})(src);
console.log(out.join(' '));
