package bench

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestSampleCPUCountsGrandchildrenInTheirChildsGroup(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	// The outer sh only waits, so the group's time is the inner one's, as
	// func-e's Envoy is the bench's grandchild.
	cmd := exec.Command("sh", "-c", `sh -c 'while :; do :; done'; exit 0`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // to kill both
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	time.Sleep(100 * time.Millisecond) // let the inner sh start
	before := sampleCPU()
	time.Sleep(500 * time.Millisecond)
	after := sampleCPU()
	cores := after.coresSince(before)
	t.Logf("cores: %v", cores)
	if c := cores["sh"]; c < 0.05 || c > 1.1 {
		t.Errorf("a busy grandchild used %.2f cores in its child's group, want some, and at most one", c)
	}
	if c := cores["bench"]; c > 1.1 {
		t.Errorf("the test's own process used %.2f cores while it slept", c)
	}
	if got := (*cpuSample)(nil).coresSince(before); got != nil {
		t.Errorf("a missing sample gave %v", got)
	}
}
