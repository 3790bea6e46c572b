package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shizu-gpu/shizu/shared/rentalview"
)

// The tenant verbs' client of the gateway's HTTP/JSON API (services/
// gateway): an API key, JSON bodies, RFC 9457 problems as one line, and
// the rental's Server-Sent Events.

// Exit codes of a call the gateway answered with a problem (see
// docs/cli.md): the request, the key, what it names, or the platform.
const (
	exitDenied      = 3 // 401, 403: the key is missing, not valid, or may not do this
	exitNotFound    = 4 // 404
	exitUnavailable = 5 // 429, 5xx, or the gateway could not be reached: try again
)

// apiProblem is an RFC 9457 problem the gateway answered with.
type apiProblem struct {
	Status    int    `json:"status"`
	Title     string `json:"title"`
	Detail    string `json:"detail"`
	RequestID string `json:"request_id"`
	// RetryAfter is the Retry-After header of a 429, when sent.
	RetryAfter string `json:"-"`
}

func (p *apiProblem) Error() string {
	s := p.Title
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	if p.RequestID != "" {
		s += " (request id " + p.RequestID + ")"
	}
	return s
}

// exitCode maps the problem's status to the CLI's exit codes.
func (p *apiProblem) exitCode() int {
	switch {
	case p.Status == http.StatusUnauthorized || p.Status == http.StatusForbidden:
		return exitDenied
	case p.Status == http.StatusNotFound:
		return exitNotFound
	case p.Status == http.StatusTooManyRequests || p.Status >= 500:
		return exitUnavailable
	case p.Status >= 400:
		return exitUsage
	}
	return exitFail
}

// unreachableError is a gateway that did not answer at all.
type unreachableError struct{ err error }

func (e unreachableError) Error() string { return e.err.Error() }
func (e unreachableError) Unwrap() error { return e.err }
func (unreachableError) exitCode() int   { return exitUnavailable }

// exitCodeOf is the exit code of a verb's error: one that names its own
// (a problem of the gateway), else 1.
func exitCodeOf(err error) int {
	var ec interface{ exitCode() int }
	if errors.As(err, &ec) {
		return ec.exitCode()
	}
	return exitFail
}

// apiClient calls one gateway with one API key.
type apiClient struct {
	base *url.URL
	key  string
	// keyFrom says where the key came from, for error messages.
	keyFrom string
	http    *http.Client
	// timeout bounds each call that is not an event stream.
	timeout time.Duration
}

// apiFlags are the flags of a verb that talks to the gateway.
type apiFlags struct {
	devDir  string
	url     string
	output  string
	timeout time.Duration
}

func (f *apiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.devDir, "dev-dir", envOr("SHIZU_DEV_DIR", ".shizu"), "data folder of a running shizu dev, whose env file gives the gateway and a key [SHIZU_DEV_DIR]")
	fs.StringVar(&f.url, "api-url", "", "gateway URL (default: SHIZU_API_URL, else the dev env file, else shizu login's)")
	fs.StringVar(&f.output, "o", "table", "output: table or json")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for each answer of the gateway")
}

// client resolves the gateway and key: SHIZU_API_URL and SHIZU_API_KEY
// win, then the env file of a running shizu dev (-dev-dir), then what
// shizu login saved; -api-url wins over all for the URL.
func (f *apiFlags) client() (*apiClient, error) {
	if f.output != "table" && f.output != "json" {
		return nil, usagef("-o %q: want table or json", f.output)
	}
	c, err := resolveCredentials(f.devDir)
	if err != nil {
		return nil, err
	}
	if f.url != "" {
		c.URL, c.URLFrom = f.url, "-api-url"
	}
	if c.Key == "" {
		return nil, errors.New("no API key: run `shizu login` with your key (or start `shizu dev`, which makes one), or set SHIZU_API_KEY")
	}
	if c.URL == "" {
		return nil, fmt.Errorf("no gateway URL for the key from %s: pass -api-url, set SHIZU_API_URL or run `shizu login -url URL`", c.KeyFrom)
	}
	return newAPIClient(c.URL, c.Key, c.KeyFrom, f.timeout)
}

func newAPIClient(rawURL, key, keyFrom string, timeout time.Duration) (*apiClient, error) {
	u, err := url.Parse(strings.TrimRight(rawURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usagef("gateway URL %q: want http(s)://host[:port]", rawURL)
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &apiClient{base: u, key: key, keyFrom: keyFrom, timeout: timeout,
		http: &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment,
			DialContext: (&net.Dialer{Timeout: 3 * time.Second}).DialContext, ResponseHeaderTimeout: timeout}}}, nil
}

// newIdempotencyKey is a fresh Idempotency-Key for one invocation.
func newIdempotencyKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "cli-" + hex.EncodeToString(b)
}

// request is one call: method, path (with query), a JSON body or nil, and
// extra headers.
type request struct {
	method, path string
	body         any
	header       http.Header
}

// send makes the call and returns the answer when its status is 2xx; a
// problem is an *apiProblem.
func (c *apiClient) send(ctx context.Context, rq request) (*http.Response, error) {
	var body io.Reader
	if rq.body != nil {
		b, err := json.Marshal(rq.body)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, c.base.String()+rq.path, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range rq.header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("User-Agent", "shizu-cli")
	if rq.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, unreachableError{fmt.Errorf("cannot reach the gateway at %s: %s; is `shizu dev` running? (or check shizu login's URL)", c.base, oneLine(unwrapURLError(err)))}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, readProblem(resp, c.keyFrom)
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// readProblem decodes a problem answer; one that is not a problem is
// described by its status.
func readProblem(resp *http.Response, keyFrom string) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	p := &apiProblem{}
	if json.Unmarshal(b, p) != nil || p.Title == "" {
		p = &apiProblem{Title: http.StatusText(resp.StatusCode), Detail: strings.TrimSpace(string(b))}
	}
	p.Status, p.RetryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	if p.RequestID == "" {
		p.RequestID = resp.Header.Get("X-Request-Id")
	}
	if p.Status == http.StatusUnauthorized && keyFrom != "" {
		p.Detail += " (key from " + keyFrom + "; run `shizu login` with a valid key)"
	}
	return p
}

// rateRetries is how many times a call the key's rate limit refused
// (429) is made again, after its Retry-After.
const rateRetries = 3

// do makes the call and decodes the JSON answer into out (when not nil).
// A call refused by the rate limit is made again after its Retry-After,
// up to rateRetries times (a POST carries its Idempotency-Key, so a retry
// creates nothing twice).
func (c *apiClient) do(ctx context.Context, rq request, out any) error {
	for attempt := 0; ; attempt++ {
		err := c.once(ctx, rq, out)
		var p *apiProblem
		if !errors.As(err, &p) || p.Status != http.StatusTooManyRequests || attempt == rateRetries {
			return err
		}
		wait := time.Second
		if n, perr := strconv.Atoi(p.RetryAfter); perr == nil && n > 0 {
			wait = time.Duration(min(n, 30)) * time.Second
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

func isRateLimited(err error) bool {
	var p *apiProblem
	return errors.As(err, &p) && p.Status == http.StatusTooManyRequests
}

// once makes the call once, within the client's timeout.
func (c *apiClient) once(ctx context.Context, rq request, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.send(ctx, rq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("read the gateway's answer to %s %s: %w", rq.method, rq.path, err)
	}
	return nil
}

// followEvents reads the rental's event stream, calling each with every
// state of the rental, until each returns true, the stream ends (the
// rental ended) or ctx ends. It returns the last state read (nil when
// none).
func (c *apiClient) followEvents(ctx context.Context, rentalID string, each func(*rentalView) bool) (*rentalView, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // leaving closes the stream: the gateway keeps nothing
	rq := request{method: http.MethodGet, path: "/v1/rentals/" + url.PathEscape(rentalID) + "/events",
		header: http.Header{"Accept": {"text/event-stream"}}}
	resp, err := c.send(ctx, rq)
	for attempt := 0; attempt < rateRetries && isRateLimited(err); attempt++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
		resp, err = c.send(ctx, rq)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var last *rentalView
	err = readSSE(resp.Body, func(event, data string) bool {
		if event != "rental" {
			return false
		}
		r := &rentalView{}
		if json.Unmarshal([]byte(data), r) != nil {
			return false
		}
		last = r
		return each(r)
	})
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return last, ctx.Err()
	}
	if err != nil && last == nil {
		return nil, fmt.Errorf("follow rental %s: %w", rentalID, err)
	}
	return last, nil
}

// readSSE calls each with every event of a Server-Sent Events stream
// (comments skipped, multi-line data joined) until each returns true or
// the stream ends.
func readSSE(r io.Reader, each func(event, data string) bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 && each(event, strings.Join(data, "\n")) {
				return nil
			}
			event, data = "", nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return sc.Err()
}

// UnmarshalJSON reads a rental as the gateway answers it (the API's
// Rental), with what its events say in people's words.
func (r *rentalView) UnmarshalJSON(b []byte) error {
	var x rentalview.Rental
	if err := json.Unmarshal(b, &x); err != nil {
		return err
	}
	*r = rentalView(x)
	r.inPeoplesWords()
	return nil
}
