package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

const (
	// SessionTTL is how long a session lasts from its sign-in.
	SessionTTL = 8 * time.Hour
	// MaxSessions bounds the sessions held: past it a sign-in first
	// drops the expired ones, then the oldest.
	MaxSessions = 1024
	// CookieName is the session cookie's name.
	CookieName = "hutch_console"
	// CSRFHeader carries the session's CSRF token on every call that is
	// not a GET.
	CSRFHeader = "X-Hutch-Csrf"
)

// session is one signed-in browser: the key it signed in with, its CSRF
// token, and the envd access tokens it has obtained.
type session struct {
	id      string
	key     string
	csrf    string
	created time.Time
	expires time.Time
	// operator: the key is serve's operator key, which acts as no
	// tenant; the pages show the operator's view.
	operator bool

	// mu guards tokens: envd access tokens by sandbox ID.
	mu     sync.Mutex
	tokens map[string]string
}

func (s *session) token(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[id]
	return t, ok
}

func (s *session) setToken(id, tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A session reaches a bounded number of sandboxes worth caching.
	if len(s.tokens) >= 256 {
		clear(s.tokens)
	}
	s.tokens[id] = tok
}

func (s *session) dropToken(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, id)
}

// csrfOK tells whether tok is the session's CSRF token.
func (s *session) csrfOK(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) == 1
}

// sessions is the sessions held, bounded by max.
type sessions struct {
	now func() time.Time
	max int

	// mu guards byID.
	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(now func() time.Time, max int) *sessions {
	return &sessions{now: now, max: max, byID: map[string]*session{}}
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// add makes a session for key (the operator's key if operator).
func (ss *sessions) add(key string, operator bool) *session {
	now := ss.now()
	s := &session{id: randomToken(), key: key, csrf: randomToken(), created: now, expires: now.Add(SessionTTL), operator: operator, tokens: map[string]string{}}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.byID) >= ss.max {
		ss.evictLocked(now)
	}
	ss.byID[s.id] = s
	return s
}

// evictLocked drops the expired sessions, and the oldest one if none
// had expired.
func (ss *sessions) evictLocked(now time.Time) {
	var oldest *session
	for id, s := range ss.byID {
		if !now.Before(s.expires) {
			delete(ss.byID, id)
			continue
		}
		if oldest == nil || s.created.Before(oldest.created) {
			oldest = s
		}
	}
	if len(ss.byID) >= ss.max && oldest != nil {
		delete(ss.byID, oldest.id)
	}
}

// get is the live session of id; expired tells a session that was
// there and has expired (it is dropped).
func (ss *sessions) get(id string) (s *session, expired bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.byID[id]
	if !ok {
		return nil, false
	}
	if !ss.now().Before(s.expires) {
		delete(ss.byID, id)
		return nil, true
	}
	return s, false
}

func (ss *sessions) remove(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, id)
}

func (ss *sessions) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.byID)
}
