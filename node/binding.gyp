{
  "targets": [{
    "target_name": "uvccl",
    "sources": [
      "src/module.cc", "src/op.cc", "src/group.cc", "src/store.cc",
      "<!@(node scripts/sources.js)"
    ],
    "include_dirs": [
      "<!(node -p \"require('node-addon-api').include_dir\")",
      "../include", "../src"
    ],
    "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED"],
    "cflags": ["-fvisibility=hidden", "-pthread", "-Wno-unused-parameter"],
    "cflags_c": ["-std=gnu11"],
    "cflags_cc": ["-std=c++17", "-fexceptions"],
    "cflags_cc!": ["-fno-exceptions"],
    "libraries": ["-ldl", "-lm", "-pthread"]
  }]
}
