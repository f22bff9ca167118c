package serve

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/containerd/errdefs"
)

// networkPolicy maps E2B's network fields onto hutch's modes: no internet
// access (or 0.0.0.0/0 denied) is none, or allow with allowOut as its
// rules; internet access is open. hutch's denied ranges (link-local, private,
// the host) hold in every mode.
func (s *Server) networkPolicy(internet *bool, n *networkJSON, def string) (string, []string, error) {
	if n != nil {
		for name, m := range map[string]json.RawMessage{"network.rules": n.Rules, "network.egressProxy": n.EgressProxy, "network.httpsPorts": n.HTTPSPorts} {
			if !isNull(m) {
				return "", nil, fmt.Errorf("%s is not supported by hutch serve: %w", name, errdefs.ErrNotImplemented)
			}
		}
		if n.MaskRequestHost != "" {
			return "", nil, fmt.Errorf("network.maskRequestHost is not supported by hutch serve: %w", errdefs.ErrNotImplemented)
		}
	}
	denyAll := internet != nil && !*internet
	var allowOut []string
	if n != nil {
		allowOut = n.AllowOut
		for _, d := range n.DenyOut {
			if d == "0.0.0.0/0" {
				denyAll = true
				continue
			}
			return "", nil, fmt.Errorf("network.denyOut %q: hutch serve denies only everything (0.0.0.0/0); it always denies link-local, private ranges and the host: %w", d, errdefs.ErrNotImplemented)
		}
	}
	switch {
	case denyAll:
		// allow with no rules denies as none does, but keeps a network
		// link, so that a later update can open it.
		return "allow", allowOut, nil
	case internet != nil && *internet:
		return "open", nil, nil
	case len(allowOut) > 0 && def == "none":
		return "allow", allowOut, nil
	}
	return def, nil, nil
}

func (s *Server) updateNetwork(r *http.Request, tenantName string) (int, any, error) {
	var body struct {
		AllowOut            []string        `json:"allowOut"`
		DenyOut             []string        `json:"denyOut"`
		AllowInternetAccess *bool           `json:"allow_internet_access"`
		Rules               json.RawMessage `json:"rules"`
		EgressProxy         json.RawMessage `json:"egressProxy"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	sb, err := s.owned(r.Context(), tenantName, r.PathValue("id"))
	if err != nil {
		return 0, nil, err
	}
	// Omitted fields are cleared, as E2B does: an update that denies
	// nothing opens the sandbox (hutch's denied ranges still hold).
	mode, allow, err := s.networkPolicy(body.AllowInternetAccess, &networkJSON{AllowOut: body.AllowOut, DenyOut: body.DenyOut, Rules: body.Rules, EgressProxy: body.EgressProxy}, "open")
	if err != nil {
		return 0, nil, err
	}
	if allow == nil {
		allow = []string{}
	}
	if err := s.place.UpdateNetwork(context.WithoutCancel(r.Context()), sb.ID, mode, allow); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}
