package serve

import (
	"fmt"
	"net/http"
	"time"

	"github.com/containerd/errdefs"

	"hutch.dev/hutch/credential"
	"hutch.dev/hutch/serve/tenant"
)

// E2B's /api-keys: a tenant lists, makes, renames and revokes its own
// API keys. The operator's `hutch tenant add` makes a tenant's first.

// apiKeyJSON is E2B's TeamAPIKey, and with Key its CreatedTeamAPIKey.
type apiKeyJSON struct {
	ID        string      `json:"id"`
	Name      string      `json:"name"`
	Key       string      `json:"key,omitempty"`
	Mask      keyMaskJSON `json:"mask"`
	CreatedAt time.Time   `json:"createdAt"`
	CreatedBy *struct{}   `json:"createdBy"`
	LastUsed  *time.Time  `json:"lastUsed"`
}

// keyMaskJSON is E2B's IdentifierMaskingDetails.
type keyMaskJSON struct {
	Prefix            string `json:"prefix"`
	ValueLength       int    `json:"valueLength"`
	MaskedValuePrefix string `json:"maskedValuePrefix"`
	MaskedValueSuffix string `json:"maskedValueSuffix"`
}

func keyJSON(k tenant.APIKey) apiKeyJSON {
	return apiKeyJSON{
		ID: k.ID, Name: k.Name, CreatedAt: k.Created,
		Mask: keyMaskJSON{Prefix: credential.APIKeyPrefix, ValueLength: len(credential.NewAPIKey()), MaskedValueSuffix: k.Suffix},
	}
}

// keyStore is the tenants file, which a server without --tenants has
// not: its one key is serve/api.key.
func (s *Server) keyStore() (*tenant.Store, error) {
	if s.cfg.Tenants == nil {
		return nil, fmt.Errorf("this server has one API key (serve/api.key under its state root) and no tenants file: API keys are managed with hutch serve --tenants FILE: %w", errdefs.ErrNotImplemented)
	}
	return s.cfg.Tenants, nil
}

func (s *Server) listAPIKeys(r *http.Request, tenantName string) (int, any, error) {
	st, err := s.keyStore()
	if err != nil {
		return 0, nil, err
	}
	keys, err := st.Keys(tenantName)
	if err != nil {
		return 0, nil, err
	}
	out := []apiKeyJSON{}
	for _, k := range keys {
		out = append(out, keyJSON(k))
	}
	return http.StatusOK, out, nil
}

func (s *Server) createAPIKey(r *http.Request, tenantName string) (int, any, error) {
	st, err := s.keyStore()
	if err != nil {
		return 0, nil, err
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	key, k, err := st.AddKey(tenantName, body.Name)
	if err != nil {
		return 0, nil, err
	}
	out := keyJSON(k)
	out.Key = key
	return http.StatusCreated, out, nil
}

func (s *Server) renameAPIKey(r *http.Request, tenantName string) (int, any, error) {
	st, err := s.keyStore()
	if err != nil {
		return 0, nil, err
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &body); err != nil {
		return 0, nil, err
	}
	if err := st.RenameKey(tenantName, r.PathValue("apiKeyID"), body.Name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, nil, nil
}

func (s *Server) revokeAPIKey(r *http.Request, tenantName string) (int, any, error) {
	st, err := s.keyStore()
	if err != nil {
		return 0, nil, err
	}
	if err := st.RevokeKey(tenantName, r.PathValue("apiKeyID")); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// accessTokens answers E2B's access tokens, which E2B has deprecated
// for API keys: 410, as its API does.
func (s *Server) accessTokens(r *http.Request, tenantName string) (int, any, error) {
	return 0, nil, fmt.Errorf("access tokens are deprecated: use API keys (POST /api-keys): %w", errGone)
}
