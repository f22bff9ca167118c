package registry

import (
	"io"
	"sync"
	"time"

	"github.com/moby/buildkit/client"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// progress reports one pull or push as a BuildKit vertex with a status
// line per blob, which BuildKit's progress display draws as bars. A nil
// *progress reports nothing.
type progress struct {
	ch     chan<- *client.SolveStatus
	vertex *client.Vertex
	mu     sync.Mutex // guards sends after done
	done   bool
}

func newProgress(ch chan<- *client.SolveStatus, name string) *progress {
	if ch == nil {
		return nil
	}
	now := time.Now()
	p := &progress{ch: ch, vertex: &client.Vertex{Digest: digest.FromString(name + now.String()), Name: name, Started: &now}}
	p.send(&client.SolveStatus{Vertexes: []*client.Vertex{p.vertex}})
	return p
}

func (p *progress) send(s *client.SolveStatus) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.done {
		p.ch <- s
	}
}

// blob is the status of one blob: current of total bytes.
func (p *progress) blob(desc ocispec.Descriptor, verb string, started time.Time, current int64, completed bool) {
	if p == nil {
		return
	}
	now := time.Now()
	st := &client.VertexStatus{
		ID: verb + " " + desc.Digest.String(), Vertex: p.vertex.Digest,
		Current: current, Total: desc.Size, Timestamp: now, Started: &started,
	}
	if completed {
		st.Completed = &now
	}
	p.send(&client.SolveStatus{Statuses: []*client.VertexStatus{st}})
}

// finish marks the vertex done (with err, if any) and closes the channel.
func (p *progress) finish(err error) {
	if p == nil {
		return
	}
	now := time.Now()
	v := *p.vertex
	v.Completed = &now
	if err != nil {
		v.Error = err.Error()
	}
	p.send(&client.SolveStatus{Vertexes: []*client.Vertex{&v}})
	p.mu.Lock()
	p.done = true
	close(p.ch)
	p.mu.Unlock()
}

// reader counts the bytes read from a blob and reports them, at most ten
// times a second.
type reader struct {
	io.ReadCloser
	p       *progress
	desc    ocispec.Descriptor
	verb    string
	started time.Time
	n       int64
	last    time.Time
}

func (p *progress) wrap(rc io.ReadCloser, desc ocispec.Descriptor, verb string) io.ReadCloser {
	if p == nil {
		return rc
	}
	r := &reader{ReadCloser: rc, p: p, desc: desc, verb: verb, started: time.Now()}
	p.blob(desc, verb, r.started, 0, false)
	return r
}

func (r *reader) Read(b []byte) (int, error) {
	n, err := r.ReadCloser.Read(b)
	r.n += int64(n)
	if now := time.Now(); now.Sub(r.last) > 100*time.Millisecond || err != nil {
		r.last = now
		r.p.blob(r.desc, r.verb, r.started, r.n, err == io.EOF || r.n == r.desc.Size)
	}
	return n, err
}
