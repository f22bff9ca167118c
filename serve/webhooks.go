package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/engine"
	"hutch.dev/hutch/serve/placement"
)

// Sandbox lifecycle events and E2B's webhooks (/events/webhooks): a
// tenant registers a URL and the events it wants; each event of its
// sandboxes is POSTed there as E2B posts it, signed with the webhook's
// secret in the e2b-signature header, in order, retried with backoff.
// Deliveries go only to destinations the operator allows
// (--webhook-allow): a webhook names a URL, which a tenant could point at
// anything the server reaches.

// The event types, E2B's.
const (
	eventCreated      = "sandbox.lifecycle.created"
	eventKilled       = "sandbox.lifecycle.killed"
	eventUpdated      = "sandbox.lifecycle.updated"
	eventPaused       = "sandbox.lifecycle.paused"
	eventResumed      = "sandbox.lifecycle.resumed"
	eventCheckpointed = "sandbox.lifecycle.checkpointed"
)

var eventTypes = []string{eventCreated, eventKilled, eventUpdated, eventPaused, eventResumed, eventCheckpointed}

// Bounds of the webhooks.
const (
	maxWebhooks      = 10
	webhookQueue     = 1000
	webhookAttempts  = 6
	webhookTimeout   = 10 * time.Second
	reconcileEvery   = 2 * time.Second
	webhookFirstWait = 500 * time.Millisecond
)

// webhook is a tenant's registered webhook, as the state file keeps it.
type webhook struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	Enabled   bool      `json:"enabled"`
	Events    []string  `json:"events"`
	Secret    string    `json:"signatureSecret"`
	CreatedAt time.Time `json:"createdAt"`
}

// webhookJSON is a webhook as the API shows it: never its secret.
func (w *webhook) json() map[string]any {
	return map[string]any{
		"id": w.ID, "teamID": w.Tenant, "name": w.Name, "createdAt": w.CreatedAt,
		"enabled": w.Enabled, "url": w.URL, "events": w.Events,
	}
}

// lifecycleEvent is E2B's event payload.
type lifecycleEvent struct {
	Version            string            `json:"version"`
	ID                 string            `json:"id"`
	Type               string            `json:"type"`
	EventData          map[string]any    `json:"eventData"`
	SandboxBuildID     string            `json:"sandboxBuildId"`
	SandboxExecutionID string            `json:"sandboxExecutionId"`
	SandboxID          string            `json:"sandboxId"`
	SandboxTeamID      string            `json:"sandboxTeamId"`
	SandboxTemplateID  string            `json:"sandboxTemplateId"`
	Timestamp          time.Time         `json:"timestamp"`
	metadata           map[string]string // for eventData
}

// knownSandbox is what the events keep of a sandbox, to tell its next
// event and to describe it once it is gone.
type knownSandbox struct {
	tenant, template, state string
	metadata                map[string]string
}

// eventHub holds the webhooks and their deliveries.
type eventHub struct {
	s    *Server
	path string
	// allow are the destinations deliveries may go to.
	allow []netip.Prefix
	hosts []string

	mu     sync.Mutex
	hooks  []*webhook
	queues map[string]chan lifecycleEvent
	known  map[string]knownSandbox
	// usage are the tenants' samples (teammetrics.go); starts the
	// creates of each tenant since sampledAt.
	usage     map[string][]teamSample
	starts    map[string]int
	sampledAt time.Time
}

// newEvents loads the webhooks of the state directory.
func newEvents(s *Server, dir string, allow []string) (*eventHub, error) {
	ev := &eventHub{s: s, path: filepath.Join(dir, "webhooks.json"), queues: map[string]chan lifecycleEvent{}, known: map[string]knownSandbox{}}
	for _, a := range allow {
		if p, err := netip.ParsePrefix(a); err == nil {
			ev.allow = append(ev.allow, p.Masked())
		} else if ip, err := netip.ParseAddr(a); err == nil {
			ev.allow = append(ev.allow, netip.PrefixFrom(ip, ip.BitLen()))
		} else if _, err := parseHostName(a); err == nil {
			ev.hosts = append(ev.hosts, normalHost(a))
		} else {
			return nil, fmt.Errorf("webhook allow %q: want a CIDR, an address or a host name: %w", a, errdefs.ErrInvalidArgument)
		}
	}
	b, err := os.ReadFile(ev.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &ev.hooks); err != nil {
			return nil, fmt.Errorf("%s: %w", ev.path, err)
		}
	}
	for _, h := range ev.hooks {
		ev.startQueue(h)
	}
	return ev, nil
}

func (ev *eventHub) saveLocked() error {
	b, err := json.MarshalIndent(ev.hooks, "", "  ")
	if err != nil {
		return err
	}
	return writeFile0600(ev.path, b)
}

// writeFile0600 replaces path with b, mode 0600 from its creation on.
func writeFile0600(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// allowed tells whether a delivery may go to host:port at addr.
func (ev *eventHub) allowedHost(host string) bool {
	return slices.Contains(ev.hosts, normalHost(host))
}

func (ev *eventHub) allowedAddr(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ev.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// checkURL refuses a webhook URL no delivery could go to.
func (ev *eventHub) checkURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("url %q: want an http:// or https:// URL: %w", clip(raw, 200), errdefs.ErrInvalidArgument)
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if !ev.allowedAddr(a) {
			return nil, fmt.Errorf("url %q: the server's operator allows webhooks to other destinations only (hutch serve --webhook-allow): %w", clip(raw, 200), errdefs.ErrInvalidArgument)
		}
		return u, nil
	}
	if !ev.allowedHost(host) && len(ev.allow) == 0 {
		return nil, fmt.Errorf("url %q: the server's operator allows webhooks to other destinations only (hutch serve --webhook-allow): %w", clip(raw, 200), errdefs.ErrInvalidArgument)
	}
	return u, nil
}

// dialer dials only allowed destinations: an allowed host name, or an
// address of an allowed range, as the name resolves at the dial (so a
// name that later resolves elsewhere gets nothing).
func (ev *eventHub) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: webhookTimeout}
	if ev.allowedHost(host) {
		return d.DialContext(ctx, network, addr)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if ev.allowedAddr(ip) {
			return d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
		}
	}
	return nil, fmt.Errorf("webhook destination %s: not an address the operator allows", host)
}

// emit records an event of sandbox sb (or, for killed, of the sandbox
// last known as id) and queues it for the webhooks of its tenant that
// want it.
func (ev *eventHub) emit(typ, id string, sb *engine.Sandbox) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	k, ok := ev.known[id]
	if sb != nil {
		k = knownSandbox{tenant: sb.Labels[placement.LabelTenant], template: sb.Labels[placement.LabelTemplate], state: sb.State, metadata: metadataOf(sb)}
		ok = true
	}
	if !ok || k.tenant == "" {
		return
	}
	if typ == eventKilled {
		delete(ev.known, id)
	} else {
		ev.known[id] = k
	}
	if typ == eventCreated {
		if ev.starts == nil {
			ev.starts = map[string]int{}
		}
		ev.starts[k.tenant]++
	}
	e := lifecycleEvent{
		Version: "v1", ID: randomUUID(), Type: typ, SandboxID: id, SandboxTeamID: k.tenant,
		SandboxTemplateID: k.template, SandboxExecutionID: id, SandboxBuildID: k.template,
		Timestamp: time.Now().UTC(), metadata: k.metadata,
	}
	e.EventData = map[string]any{"sandbox_metadata": k.metadata}
	for _, h := range ev.hooks {
		if h.Tenant != k.tenant || !h.Enabled || !slices.Contains(h.Events, typ) {
			continue
		}
		select {
		case ev.queues[h.ID] <- e:
		default:
			ev.s.log.Warn("webhook queue full: event dropped", "webhook", h.ID, "tenant", h.Tenant, "event", typ, "sandbox", id)
		}
	}
}

// metadataOf is a sandbox's E2B metadata.
func metadataOf(sb *engine.Sandbox) map[string]string {
	meta := map[string]string{}
	for k, v := range sb.Labels {
		if m, ok := strings.CutPrefix(k, placement.MetaPrefix); ok {
			meta[m] = v
		}
	}
	return meta
}

// startQueue starts the delivery of h's events, in order.
func (ev *eventHub) startQueue(h *webhook) {
	q := make(chan lifecycleEvent, webhookQueue)
	ev.queues[h.ID] = q
	client := &http.Client{Timeout: webhookTimeout, Transport: &http.Transport{DialContext: ev.dial, Proxy: nil}}
	go func() {
		for e := range q {
			ev.deliver(client, h, e)
		}
	}()
}

// deliver posts e to h, retrying with backoff; a webhook removed
// meanwhile gets nothing more.
func (ev *eventHub) deliver(client *http.Client, h *webhook, e lifecycleEvent) {
	body, err := json.Marshal(e)
	if err != nil {
		return
	}
	wait := webhookFirstWait
	for attempt := 1; attempt <= webhookAttempts; attempt++ {
		ev.mu.Lock()
		live := slices.Contains(ev.hooks, h) && h.Enabled
		dest, secret := h.URL, h.Secret
		ev.mu.Unlock()
		if !live || ev.s.stopCtx.Err() != nil {
			return
		}
		sum := sha256.Sum256(append([]byte(secret), body...))
		sig := base64.RawURLEncoding.EncodeToString(sum[:])
		req, err := http.NewRequestWithContext(ev.s.stopCtx, "POST", dest, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("e2b-signature", sig)
		req.Header.Set("User-Agent", "hutch-serve-webhooks")
		resp, err := client.Do(req)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // drained
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return
			}
			err = fmt.Errorf("answered %s", resp.Status)
		}
		ev.s.log.Warn("webhook delivery failed", "webhook", h.ID, "tenant", h.Tenant, "event", e.Type, "attempt", attempt, "err", err)
		select {
		case <-time.After(wait):
		case <-ev.s.stopCtx.Done():
			return
		}
		wait *= 2
	}
}

// reconcile finds the changes no call made: sandboxes that expired,
// paused at their timeout or were removed by others, and samples the
// tenants' usage.
func (ev *eventHub) reconcile(ctx context.Context) {
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		all, err := ev.s.place.List(ctx, "")
		if err != nil {
			continue
		}
		seen := map[string]*engine.Sandbox{}
		running := map[string]int{}
		for _, sb := range all {
			seen[sb.ID] = sb
			if sb.State == engine.StateRunning {
				running[sb.Labels[placement.LabelTenant]]++
			}
		}
		ev.mu.Lock()
		ev.sampleLocked(time.Now(), running)
		var gone []string
		var changed []*engine.Sandbox
		for id, k := range ev.known {
			sb, ok := seen[id]
			switch {
			case !ok:
				gone = append(gone, id)
			case sb.State != k.state && (sb.State == engine.StatePaused || sb.State == engine.StateRunning):
				changed = append(changed, sb)
			}
		}
		for id, sb := range seen {
			if _, ok := ev.known[id]; !ok && sb.State == engine.StateRunning {
				// Made before this server started, or by another: known
				// from now on, without an event.
				ev.known[id] = knownSandbox{tenant: sb.Labels[placement.LabelTenant], template: sb.Labels[placement.LabelTemplate], state: sb.State, metadata: metadataOf(sb)}
			}
		}
		ev.mu.Unlock()
		for _, id := range gone {
			ev.emit(eventKilled, id, nil)
		}
		for _, sb := range changed {
			typ := eventResumed
			if sb.State == engine.StatePaused {
				typ = eventPaused
			}
			ev.emit(typ, sb.ID, sb)
		}
	}
}

// routeEvents are the events of successful calls, by route.
var routeEvents = map[string]string{
	"POST /sandboxes":                eventCreated,
	"POST /v2/sandboxes":             eventCreated,
	"DELETE /sandboxes/{id}":         eventKilled,
	"POST /sandboxes/{id}/pause":     eventPaused,
	"POST /sandboxes/{id}/timeout":   eventUpdated,
	"POST /sandboxes/{id}/refreshes": eventUpdated,
	"PUT /sandboxes/{id}/network":    eventUpdated,
	"POST /sandboxes/{id}/snapshots": eventCheckpointed,
	"POST /sandboxes/{id}/fork":      eventCreated,
}

// afterCall emits the event of a successful call r answered with body.
func (s *Server) afterCall(r *http.Request, body any) {
	typ, ok := routeEvents[r.Pattern]
	if !ok || s.events == nil {
		return
	}
	ids := []string{r.PathValue("id")}
	switch b := body.(type) {
	case sandboxJSON:
		ids = []string{b.SandboxID}
	case []forkResult:
		ids = nil
		for _, c := range b {
			if c.Sandbox != nil {
				ids = append(ids, c.Sandbox.SandboxID)
			}
		}
	}
	for _, id := range ids {
		if id == "" {
			continue
		}
		if typ == eventKilled {
			s.events.emit(typ, id, nil)
			continue
		}
		sb, err := s.place.Get(context.WithoutCancel(r.Context()), id)
		if err != nil {
			continue
		}
		s.events.emit(typ, id, sb)
	}
}

func (s *Server) webhookOf(r *http.Request, tenantName string) (*webhook, error) {
	id := r.PathValue("webhookID")
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	for _, h := range s.events.hooks {
		if h.ID == id && h.Tenant == tenantName {
			return h, nil
		}
	}
	return nil, fmt.Errorf("webhook %q not found: %w", clip(id, 64), errdefs.ErrNotFound)
}

type webhookBody struct {
	Name            *string  `json:"name"`
	URL             *string  `json:"url"`
	Enabled         *bool    `json:"enabled"`
	Events          []string `json:"events"`
	SignatureSecret *string  `json:"signatureSecret"`
}

func checkEvents(evs []string) error {
	for _, e := range evs {
		if !slices.Contains(eventTypes, e) {
			return fmt.Errorf("events: %q is not an event type (%s): %w", clip(e, 80), strings.Join(eventTypes, ", "), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func (s *Server) createWebhook(r *http.Request, tenantName string) (int, any, error) {
	var b webhookBody
	if err := decodeBody(r, &b); err != nil {
		return 0, nil, err
	}
	if b.URL == nil || b.Name == nil || strings.TrimSpace(*b.Name) == "" {
		return 0, nil, fmt.Errorf("name and url are required: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := s.events.checkURL(*b.URL); err != nil {
		return 0, nil, err
	}
	if len(b.Events) == 0 {
		b.Events = eventTypes
	}
	if err := checkEvents(b.Events); err != nil {
		return 0, nil, err
	}
	if b.SignatureSecret == nil || len(*b.SignatureSecret) < 8 {
		return 0, nil, fmt.Errorf("signatureSecret: at least 8 characters, which each delivery is signed with (e2b-signature): %w", errdefs.ErrInvalidArgument)
	}
	h := &webhook{ID: randomUUID(), Tenant: tenantName, Name: clip(*b.Name, 200), URL: *b.URL, Enabled: b.Enabled == nil || *b.Enabled, Events: b.Events, Secret: *b.SignatureSecret, CreatedAt: time.Now().UTC()}
	ev := s.events
	ev.mu.Lock()
	defer ev.mu.Unlock()
	n := 0
	for _, o := range ev.hooks {
		if o.Tenant == tenantName {
			n++
		}
	}
	if n >= maxWebhooks {
		return 0, nil, fmt.Errorf("a tenant has at most %d webhooks: %w", maxWebhooks, errdefs.ErrResourceExhausted)
	}
	ev.hooks = append(ev.hooks, h)
	if err := ev.saveLocked(); err != nil {
		ev.hooks = ev.hooks[:len(ev.hooks)-1]
		return 0, nil, err
	}
	ev.startQueue(h)
	return http.StatusCreated, h.json(), nil
}

func (s *Server) listWebhooks(r *http.Request, tenantName string) (int, any, error) {
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	out := []map[string]any{}
	for _, h := range s.events.hooks {
		if h.Tenant == tenantName {
			out = append(out, h.json())
		}
	}
	return http.StatusOK, out, nil
}

func (s *Server) getWebhook(r *http.Request, tenantName string) (int, any, error) {
	h, err := s.webhookOf(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	s.events.mu.Lock()
	defer s.events.mu.Unlock()
	return http.StatusOK, h.json(), nil
}

func (s *Server) updateWebhook(r *http.Request, tenantName string) (int, any, error) {
	h, err := s.webhookOf(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	var b webhookBody
	if err := decodeBody(r, &b); err != nil {
		return 0, nil, err
	}
	if b.URL != nil {
		if _, err := s.events.checkURL(*b.URL); err != nil {
			return 0, nil, err
		}
	}
	if b.Events != nil {
		if err := checkEvents(b.Events); err != nil {
			return 0, nil, err
		}
	}
	ev := s.events
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if b.Name != nil {
		h.Name = clip(*b.Name, 200)
	}
	if b.URL != nil {
		h.URL = *b.URL
	}
	if b.Enabled != nil {
		h.Enabled = *b.Enabled
	}
	if b.Events != nil {
		h.Events = b.Events
	}
	if b.SignatureSecret != nil {
		h.Secret = *b.SignatureSecret
	}
	if err := ev.saveLocked(); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, h.json(), nil
}

func (s *Server) deleteWebhook(r *http.Request, tenantName string) (int, any, error) {
	h, err := s.webhookOf(r, tenantName)
	if err != nil {
		return 0, nil, err
	}
	ev := s.events
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.hooks = slices.DeleteFunc(ev.hooks, func(o *webhook) bool { return o == h })
	if q := ev.queues[h.ID]; q != nil {
		close(q)
		delete(ev.queues, h.ID)
	}
	if err := ev.saveLocked(); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, nil, nil
}
