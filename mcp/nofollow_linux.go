package mcp

import "syscall"

// syscallNoFollow makes an open refuse a symlink in the last component.
const syscallNoFollow = syscall.O_NOFOLLOW
