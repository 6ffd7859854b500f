package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the child if benchrun dies without
// stopping it (SIGKILL, a crash), so no redis-server or service outlives a run.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
