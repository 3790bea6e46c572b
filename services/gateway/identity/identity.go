// Package identity is who may call the tenant API: tenants and their API
// keys, kept in the IDENTITY key-value bucket (the system of record), and
// a watched cache of the keys that every gateway replica authenticates
// against, so a revocation reaches every replica within a second.
//
// A key is "shz_<key id>_<secret>". Only its SHA-256 is stored; the whole
// key is shown once, by CreateKey.
package identity

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"regexp"
	"strings"
	"time"

	"github.com/shizu-gpu/shizu/shared/fault"
)

// Scope is what a key may do.
type Scope string

// The scopes. A tenant key is read-only or read-write; an operator key
// belongs to no tenant and is for the operator endpoints only.
const (
	ReadOnly  Scope = "read-only"
	ReadWrite Scope = "read-write"
	Operator  Scope = "operator"
)

// OperatorTenant is the tenant token an operator key's audit records carry;
// no tenant may take it as its id.
const OperatorTenant = "operator"

// ParseScope reads a scope as people write it.
func ParseScope(s string) (Scope, error) {
	switch Scope(s) {
	case ReadOnly, ReadWrite, Operator:
		return Scope(s), nil
	}
	return "", fault.Invalid("scope %q: want read-only, read-write or operator", s)
}

// Tenant is one customer of the platform.
type Tenant struct {
	ID        string    `json:"tenant_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Key is one API key, without its secret.
type Key struct {
	ID string `json:"key_id"`
	// Tenant is the tenant the key acts for; empty for an operator key.
	Tenant    string     `json:"tenant_id,omitempty"`
	Scope     Scope      `json:"scope"`
	Name      string     `json:"name,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// SHA256 is the hex SHA-256 of the whole key.
	SHA256 string `json:"sha256"`
}

// Revoked says whether the key was revoked.
func (k Key) Revoked() bool { return k.RevokedAt != nil }

// CanWrite says whether the key may change a tenant's resources.
func (k Key) CanWrite() bool { return k.Scope == ReadWrite }

var tenantID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// CheckTenantID says what is wrong with a tenant id: 1..63 of a-z, 0-9
// and '-', starting with a letter or digit, and not "operator".
func CheckTenantID(id string) error {
	if !tenantID.MatchString(id) {
		return fault.Invalid("tenant id %q: want 1..63 characters of a-z, 0-9 and '-', starting with a letter or digit", truncate(id))
	}
	if id == OperatorTenant {
		return fault.Invalid("tenant id %q is reserved for operator keys", id)
	}
	return nil
}

const (
	keyPrefix  = "shz_"
	keyIDLen   = 12 // hex characters
	secretLen  = 48 // hex characters
	maxNameLen = 200
)

// newSecret returns a fresh key id and the whole key.
func newSecret() (id, whole string) {
	b := make([]byte, (keyIDLen+secretLen)/2)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	h := hex.EncodeToString(b)
	id = h[:keyIDLen]
	return id, keyPrefix + id + "_" + h[keyIDLen:]
}

// splitKey returns the key id of a whole key, or false when it is not
// of the form shz_<12 hex>_<48 hex>.
func splitKey(whole string) (string, bool) {
	rest, ok := strings.CutPrefix(whole, keyPrefix)
	if !ok || len(rest) != keyIDLen+1+secretLen || rest[keyIDLen] != '_' {
		return "", false
	}
	id, secret := rest[:keyIDLen], rest[keyIDLen+1:]
	if !isHex(id) || !isHex(secret) {
		return "", false
	}
	return id, true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func hashKey(whole string) string {
	sum := sha256.Sum256([]byte(whole))
	return hex.EncodeToString(sum[:])
}

// matches compares the hash of whole with k's in constant time.
func (k Key) matches(whole string) bool {
	return subtle.ConstantTimeCompare([]byte(hashKey(whole)), []byte(k.SHA256)) == 1
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
