package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Where the tenant verbs find the gateway and the API key: SHIZU_API_URL
// and SHIZU_API_KEY, the env file of a running shizu dev, or what
// `shizu login` saved in the user's config folder.

// The variables of the env file and the environment.
const (
	envAPIURL      = "SHIZU_API_URL"
	envAPIKey      = "SHIZU_API_KEY"
	envOperatorKey = "SHIZU_OPERATOR_KEY"
	// envConfigDir replaces the user's config folder (tests, sandboxes).
	envConfigDir = "SHIZU_CONFIG_DIR"
)

// defaultAPIURL is the gateway of `shizu dev`.
const defaultAPIURL = "http://127.0.0.1:8080"

// savedCredentials is what shizu login keeps.
type savedCredentials struct {
	URL string `json:"api_url"`
	Key string `json:"api_key"`
}

// credentials are the gateway and key a verb uses, and where each came
// from.
type credentials struct {
	URL, URLFrom string
	Key, KeyFrom string
}

// credentialsPath is the file shizu login writes: <config dir>/shizu/
// credentials (SHIZU_CONFIG_DIR replaces <config dir>/shizu).
func credentialsPath() (string, error) {
	if d := os.Getenv(envConfigDir); d != "" {
		return filepath.Join(d, "credentials"), nil
	}
	d, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no config folder for shizu login's credentials: %w (set %s)", err, envConfigDir)
	}
	return filepath.Join(d, "shizu", "credentials"), nil
}

func readSaved() (savedCredentials, string, error) {
	path, err := credentialsPath()
	if err != nil {
		return savedCredentials{}, "", err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return savedCredentials{}, path, nil
	}
	if err != nil {
		return savedCredentials{}, path, fmt.Errorf("read %s: %w", path, err)
	}
	var s savedCredentials
	if err := json.Unmarshal(b, &s); err != nil {
		return savedCredentials{}, path, fmt.Errorf("%s is not shizu login's file (%v): run `shizu logout`, then `shizu login`", path, err)
	}
	return s, path, nil
}

// readEnvFile reads the KEY=value lines of a dev env file (missing: none).
func readEnvFile(path string) map[string]string {
	vals := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return vals
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export "), "="); ok {
			vals[k] = v
		}
	}
	return vals
}

// resolveCredentials picks, for the URL and for the key each: the
// environment, else the env file of a running shizu dev in devDir, else
// shizu login's file.
func resolveCredentials(devDir string) (credentials, error) {
	envPath := envFileName(devDir)
	dev := readEnvFile(envPath)
	saved, savedPath, err := readSaved()
	if err != nil {
		return credentials{}, err
	}
	var c credentials
	pick := func(env, fromSaved string) (string, string) {
		if v := os.Getenv(env); v != "" {
			return v, env
		}
		if v := dev[env]; v != "" {
			return v, envPath
		}
		if fromSaved != "" {
			return fromSaved, savedPath
		}
		return "", ""
	}
	c.URL, c.URLFrom = pick(envAPIURL, saved.URL)
	c.Key, c.KeyFrom = pick(envAPIKey, saved.Key)
	return c, nil
}

var loginVerb = verb{
	name:    "login",
	summary: "Keep a gateway URL and API key for the tenant verbs (in your config folder, readable only by you).",
	usage:   "[-url URL] [-key KEY | the key on stdin]",
	examples: `  shizu login -url https://api.example.com < key.txt
  echo "$KEY" | shizu login
  shizu login -url http://127.0.0.1:8080 -key shz_...   # the key lands in your shell history
`,
	setup: func(fs *flag.FlagSet) func(context.Context, []string, io.Writer) error {
		rawURL := fs.String("url", "", "gateway URL (default: SHIZU_API_URL, else the one saved, else "+defaultAPIURL+")")
		key := fs.String("key", "", "API key (default: read from stdin, so it stays out of your shell history)")
		timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the gateway")
		return func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q (pass the key with -key or on stdin)", args[0])
			}
			return login(ctx, *rawURL, *key, os.Stdin, *timeout, stdout)
		}
	},
}

// login checks the key with the gateway and saves both, mode 0600 in a
// folder of mode 0700.
func login(ctx context.Context, rawURL, key string, stdin io.Reader, timeout time.Duration, stdout io.Writer) error {
	saved, path, err := readSaved()
	if err != nil {
		return err
	}
	if rawURL == "" {
		rawURL = firstOf(os.Getenv(envAPIURL), saved.URL, defaultAPIURL)
	}
	if key == "" {
		b, err := io.ReadAll(io.LimitReader(stdin, 4096))
		if err != nil {
			return fmt.Errorf("read the key from stdin: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	key = strings.TrimSpace(key)
	if key == "" {
		return usagef("no key: pass -key or the key on stdin (echo \"$KEY\" | shizu login)")
	}
	c, err := newAPIClient(rawURL, key, "", timeout)
	if err != nil {
		return err
	}
	// Any call the key may make proves it: a tenant key lists rentals.
	var page struct{}
	err = c.do(ctx, request{method: http.MethodGet, path: "/v1/rentals?limit=1"}, &page)
	var p *apiProblem
	if errors.As(err, &p) && p.Status == http.StatusUnauthorized {
		return fmt.Errorf("the gateway at %s refused the key; nothing saved: %w", c.base, err)
	}
	note := ""
	if errors.As(err, &p) && p.Status == http.StatusForbidden {
		note = " (it is not a tenant key: the tenant verbs will be refused)"
	} else if err != nil {
		return fmt.Errorf("nothing saved: %w", err)
	}
	b, _ := json.MarshalIndent(savedCredentials{URL: c.base.String(), Key: key}, "", "  ")
	if err := writePrivate(path, append(b, '\n')); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "logged in to %s; key saved in %s%s\n", c.base, path, note)
	return nil
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// writePrivate writes b to path readable only by this user, its folder
// made (mode 0700) if missing.
func writePrivate(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("credentials folder: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

var logoutVerb = verb{
	name:     "logout",
	summary:  "Forget the gateway URL and API key shizu login saved.",
	usage:    "",
	examples: "  shizu logout\n",
	setup: func(*flag.FlagSet) func(context.Context, []string, io.Writer) error {
		return func(_ context.Context, args []string, stdout io.Writer) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			path, err := credentialsPath()
			if err != nil {
				return err
			}
			switch err := os.Remove(path); {
			case errors.Is(err, os.ErrNotExist):
				fmt.Fprintf(stdout, "not logged in (no %s)\n", path)
			case err != nil:
				return fmt.Errorf("remove %s: %w", path, err)
			default:
				fmt.Fprintf(stdout, "logged out: removed %s\n", path)
			}
			if os.Getenv(envAPIKey) != "" {
				fmt.Fprintf(stdout, "note: %s is still set in your environment and is used while it is\n", envAPIKey)
			}
			return nil
		}
	},
}
