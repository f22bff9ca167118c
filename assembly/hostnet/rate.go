package hostnet

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// limitEgress shapes what a sandbox sends through its link to rate bits
// per second: a token bucket (tbf) on the sandbox's side of the link,
// where every packet its network stack sends is queued, with a burst of
// about 50 ms of the rate and a queue of about 200 ms. A sandbox sending
// as fast as it can thus leaves the host's uplink to its neighbours, and
// TCP settles at the rate. Rate 0 is no limit.
func limitEgress(h *netlink.Handle, link netlink.Link, rate int64) error {
	if rate <= 0 {
		return nil
	}
	bytes := uint64(rate / 8)
	burst := uint32(max(bytes/20, 128<<10))
	if err := h.QdiscAdd(&netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       bytes,
		Buffer:     netlink.Xmittime(bytes, burst),
		Limit:      uint32(max(bytes/5, uint64(burst)*2)),
	}); err != nil {
		return fmt.Errorf("egress rate on %s: %w", link.Attrs().Name, err)
	}
	return nil
}
