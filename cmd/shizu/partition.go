package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
)

// nodeLink is a simulated node's network path to one server (NATS or
// Redis): a TCP forwarder on loopback that the node's agent dials instead
// of the server. Cutting it drops every connection and refuses new ones,
// as a network partition would; the agent and its workloads keep running,
// and its client libraries reconnect once the link is healed.
type nodeLink struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func newNodeLink(target string) (*nodeLink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &nodeLink{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go l.serve()
	return l, nil
}

func (l *nodeLink) addr() string { return l.ln.Addr().String() }

func (l *nodeLink) serve() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		go l.forward(c)
	}
}

// track adds c to the live connections unless the link is cut.
func (l *nodeLink) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *nodeLink) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
}

func (l *nodeLink) forward(c net.Conn) {
	if !l.track(c) {
		_ = c.Close()
		return
	}
	defer l.untrack(c)
	s, err := net.Dial("tcp", l.target)
	if err != nil {
		return
	}
	if !l.track(s) {
		_ = s.Close()
		return
	}
	defer l.untrack(s)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(s, c)
	go pipe(c, s)
	<-done // either side closing (or a cut) ends both
}

// setCut cuts the link (dropping every connection) or heals it.
func (l *nodeLink) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			_ = c.Close()
		}
	}
}

func (l *nodeLink) close() {
	_ = l.ln.Close()
	l.setCut(true)
}

// viaLink returns rawURL with its host replaced by the link's address.
func viaLink(rawURL string, l *nodeLink) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("cannot route %q through a node link", rawURL)
	}
	u.Host = l.addr()
	return u.String(), nil
}

// nodeLinks are a node's links to NATS and Redis.
type nodeLinks struct {
	nats, redis *nodeLink
}

// newNodeLinks opens links to the servers of natsURL and redisURL and
// returns the URLs that go through them.
func newNodeLinks(natsURL, redisURL string) (*nodeLinks, string, string, error) {
	hostOf := func(raw string) (string, error) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("cannot route %q through a node link", raw)
		}
		return u.Host, nil
	}
	nh, err := hostOf(natsURL)
	if err != nil {
		return nil, "", "", err
	}
	rh, err := hostOf(redisURL)
	if err != nil {
		return nil, "", "", err
	}
	ls := &nodeLinks{}
	if ls.nats, err = newNodeLink(nh); err != nil {
		return nil, "", "", err
	}
	if ls.redis, err = newNodeLink(rh); err != nil {
		ls.nats.close()
		return nil, "", "", err
	}
	nu, err1 := viaLink(natsURL, ls.nats)
	ru, err2 := viaLink(redisURL, ls.redis)
	if err := errors.Join(err1, err2); err != nil {
		ls.close()
		return nil, "", "", err
	}
	return ls, nu, ru, nil
}

func (ls *nodeLinks) setCut(cut bool) {
	ls.nats.setCut(cut)
	ls.redis.setCut(cut)
}

func (ls *nodeLinks) isCut() bool {
	ls.nats.mu.Lock()
	defer ls.nats.mu.Unlock()
	return ls.nats.cut
}

func (ls *nodeLinks) close() {
	ls.nats.close()
	ls.redis.close()
}
