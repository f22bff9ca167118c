package tenant

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/policy"
)

// QuotaError is a request refused by a tenant's quota. It wraps
// errdefs.ErrResourceExhausted.
type QuotaError struct {
	// Exceeded says, for each quota the request would exceed, what is in
	// use, what was asked and the limit, e.g. "memory 3GiB in use + 2GiB
	// asked > max-memory 4GiB".
	Exceeded []string
}

func (e *QuotaError) Error() string {
	return "tenant quota exceeded: " + strings.Join(e.Exceeded, "; ")
}

// Unwrap makes a QuotaError errdefs.ErrResourceExhausted.
func (e *QuotaError) Unwrap() error { return errdefs.ErrResourceExhausted }

// cpuSlack absorbs float rounding in sums of CPU limits (0.1+0.2 cores fit
// in 0.3).
const cpuSlack = 1e-9

// Admit checks that a tenant holding used may take want more. It is nil, or
// a *QuotaError naming every quota that would be exceeded. Only what want
// asks for is checked: a tenant over one limit (lowered since) may still
// take what that limit does not bound.
func (q Quota) Admit(used, want Usage) error {
	var ex []string
	if q.MaxSandboxes > 0 && want.Sandboxes > 0 && used.Sandboxes+want.Sandboxes > q.MaxSandboxes {
		ex = append(ex, fmt.Sprintf("sandboxes %d in use + %d asked > max-sandboxes %d", used.Sandboxes, want.Sandboxes, q.MaxSandboxes))
	}
	if q.MaxCPUs > 0 && want.CPUs > 0 && used.CPUs+want.CPUs > q.MaxCPUs+cpuSlack {
		ex = append(ex, fmt.Sprintf("cpus %s in use + %s asked > max-cpus %s", cores(used.CPUs), cores(want.CPUs), cores(q.MaxCPUs)))
	}
	if q.MaxMemory > 0 && want.Memory > 0 && used.Memory+want.Memory > q.MaxMemory {
		ex = append(ex, fmt.Sprintf("memory %s in use + %s asked > max-memory %s", policy.FormatSize(used.Memory), policy.FormatSize(want.Memory), policy.FormatSize(q.MaxMemory)))
	}
	if q.MaxDisk > 0 && want.Disk > 0 && used.Disk+want.Disk > q.MaxDisk {
		ex = append(ex, fmt.Sprintf("disk %s in use + %s asked > max-disk %s", policy.FormatSize(used.Disk), policy.FormatSize(want.Disk), policy.FormatSize(q.MaxDisk)))
	}
	if q.MaxSnapshots > 0 && want.Snapshots > 0 && used.Snapshots+want.Snapshots > q.MaxSnapshots {
		ex = append(ex, fmt.Sprintf("snapshots %d kept + %d asked > max-snapshots %d", used.Snapshots, want.Snapshots, q.MaxSnapshots))
	}
	if len(ex) == 0 {
		return nil
	}
	return &QuotaError{Exceeded: ex}
}

// cores writes a number of cores without float noise (0.3, not
// 0.30000000000000004).
func cores(f float64) string { return strconv.FormatFloat(math.Round(f*1000)/1000, 'f', -1, 64) }
