package serve

import (
	"path/filepath"

	"hutch.dev/hutch/credential"
)

// The server's credential files, under its state directory.
const (
	// tokenKeyFile is the key each sandbox's tokens are derived with
	// (credential.Key): removing it revokes every token at once.
	tokenKeyFile = "token.key"
	// APIKeyFile is the API key of a server without tenants, made on
	// its first start (credential.LoadAPIKey).
	APIKeyFile = "api.key"
)

func loadTokenKey(dir string) (credential.Key, error) {
	return credential.LoadKey(filepath.Join(dir, tokenKeyFile))
}

// envdToken is the token of sandbox id's data plane (X-Access-Token).
func (s *Server) envdToken(id string) string { return s.tokens.Token(credential.Envd, id, 0) }

// trafficToken is the token port previews of sandbox id need when its
// public traffic is off (E2b-Traffic-Access-Token).
func (s *Server) trafficToken(id string) string { return s.tokens.Token(credential.Traffic, id, 0) }
