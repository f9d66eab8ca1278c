// Package release fetches and verifies releases from a channel, publishes releases into a
// channel, and (in the boot issue) builds them. Verification is streaming: each file is read
// once, every byte hashed while it is written to its target, with bounded memory; a file that
// does not match its release document is discarded and named in the error.
package release

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	apirelease "liken.dev/liken/api/release"
)

// Progress is reported while files are fetched.
type Progress struct {
	File        string
	Done, Total int64 // bytes of this file
}

// Fetcher fetches from a channel: an http://, https:// or file:// URL of a directory.
type Fetcher struct {
	// Client makes HTTP requests; nil means one with sane timeouts. Go's client stops
	// after 10 redirects, which ends redirect loops.
	Client *http.Client
	// RootCAs are the CAs that client trusts for https:// (TrustPool); nil means the
	// system's. Used only when Client is nil.
	RootCAs *x509.CertPool
	// Retries bounds the attempts after a failure that may pass (a cut connection, a stall,
	// a 5xx answer). Default 5.
	Retries int
	// Backoff is the first pause between attempts, doubled each time. Default 500ms.
	Backoff time.Duration
	// StallTimeout aborts an attempt that receives no byte for this long. Default 30s.
	StallTimeout time.Duration
	// MinRate aborts an attempt that receives fewer than MinRate bytes a second over a
	// RateWindow: a server that trickles a byte now and then never stalls, but would take
	// hours. Defaults 16 KiB/s over 30s; with them a download of N bytes ends, one way or
	// the other, within about N/MinRate plus a window for each attempt.
	MinRate    int64
	RateWindow time.Duration
	// Deadline bounds one file's download, every attempt and pause included, so retries
	// of a server just fast enough each time still end. Zero: a minute plus twice the time
	// the file's size (or, for a document, its limit) takes at MinRate.
	Deadline time.Duration
	// Progress, when set, is called as bytes arrive (at most every BufferSize bytes).
	Progress func(Progress)
	// Retrying, when set, is called before each new attempt after a failure that may pass:
	// what failed, and how long the fetcher waits before it tries again.
	Retrying func(Retry)
}

// Retry describes a failed attempt that will be tried again.
type Retry struct {
	File string
	// Attempt is the attempt about to be made (2 for the first retry) of Of in all.
	Attempt, Of int
	Wait        time.Duration
	Err         error
}

const bufferSize = 1 << 20

// Trusting is f trusting ca (PEM) besides the system's bundle, as the machines trust a
// Cluster's spec.channelCA: a copy of f, or f itself when ca is empty or f has its own client.
func (f *Fetcher) Trusting(ca string) (*Fetcher, error) {
	if ca == "" || f.Client != nil {
		return f, nil
	}
	pool, err := TrustPool(ca)
	if err != nil {
		return nil, err
	}
	c := *f
	c.RootCAs = pool
	return &c, nil
}

// TrustPool is the system's CAs and those of pem (a Cluster's spec.channelCA), for
// Fetcher.RootCAs. pem must hold at least one certificate, and nothing else.
func TrustPool(certs string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no bundle: the channel's CA alone
	}
	rest := []byte(certs)
	n := 0
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("the channel's CA holds a %s block; only certificates belong there", block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the channel's CA certificate %d: %w", n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 || len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("the channel's CA is not PEM certificates")
	}
	return pool, nil
}

func (f *Fetcher) defaults() {
	if f.Client == nil {
		f.Client = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 30 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 90 * time.Second,
			TLSClientConfig: &tls.Config{RootCAs: f.RootCAs},
		}}
	}
	if f.Retries == 0 {
		f.Retries = 5
	}
	if f.Backoff == 0 {
		f.Backoff = 500 * time.Millisecond
	}
	if f.MinRate == 0 {
		f.MinRate = 16 << 10
	}
	if f.RateWindow == 0 {
		f.RateWindow = 30 * time.Second
	}
	if f.StallTimeout == 0 {
		f.StallTimeout = 30 * time.Second
	}
}

// Document fetches a release's document and checks it against pin before parsing it.
func (f *Fetcher) Document(ctx context.Context, channel, version, pin string) (*apirelease.Document, []byte, error) {
	if !apirelease.ValidDigest(pin) {
		return nil, nil, fmt.Errorf("release %s is not pinned: a release is fetched only with the digest of its release.json", version)
	}
	raw, err := f.Raw(ctx, channel, version+"/"+apirelease.DocumentName, apirelease.MaxDocumentSize)
	if err != nil {
		return nil, nil, err
	}
	doc, err := apirelease.Parse(raw, pin)
	if err != nil {
		return nil, nil, fmt.Errorf("release %s: %w", version, err)
	}
	if doc.Version != version {
		return nil, nil, fmt.Errorf("release %s: its document says version %s", version, doc.Version)
	}
	return doc, raw, nil
}

// Raw fetches a small file of the channel (a document or the index), at most limit bytes.
func (f *Fetcher) Raw(ctx context.Context, channel, rel string, limit int64) ([]byte, error) {
	f.defaults()
	var buf limitedBuffer
	buf.limit = limit
	if err := f.download(ctx, channel, rel, -1, &bufferSink{b: &buf}, nil); err != nil {
		return nil, err
	}
	return buf.data, nil
}

// File fetches one file of a release into target, verifying size and SHA-256 as it streams.
// On any mismatch the target is discarded and the error names the file, the expected and
// the actual values.
func (f *Fetcher) File(ctx context.Context, channel, version string, file apirelease.File, target Target) error {
	f.defaults()
	sink, err := target.Begin()
	if err != nil {
		return fmt.Errorf("writing %s: %w", file.Name, err)
	}
	h := sha256.New()
	err = f.download(ctx, channel, version+"/"+file.Name, file.Size, sink, h)
	if err == nil {
		if got := hex.EncodeToString(h.Sum(nil)); got != file.SHA256 {
			err = &apirelease.MismatchError{File: file.Name, Expected: "sha256:" + file.SHA256, Actual: "sha256:" + got}
		}
	}
	if err != nil {
		if derr := sink.Discard(); derr != nil {
			return fmt.Errorf("%w (and discarding the partial file failed: %v)", err, derr)
		}
		return err
	}
	return sink.Commit()
}

// Release fetches a pinned release: its document, then every file into the target targetFor
// gives. It returns the document.
func (f *Fetcher) Release(ctx context.Context, channel, version, pin string, targetFor func(apirelease.File) (Target, error)) (*apirelease.Document, error) {
	doc, _, err := f.Document(ctx, channel, version, pin)
	if err != nil {
		return nil, err
	}
	for _, file := range doc.Files {
		t, err := targetFor(file)
		if err != nil {
			return nil, err
		}
		if err := f.File(ctx, channel, version, file, t); err != nil {
			return nil, err
		}
	}
	return doc, nil
}

var errDeadline = errors.New("the overall deadline passed")

// deadlineFor is the overall deadline of a file of (at most) size bytes: Deadline when
// set, else a minute plus twice the time size takes at MinRate, plus what every attempt
// may take to fail and the pauses between them, so a short outage never ends a small
// file's download before its retries have had their chance.
func (f *Fetcher) deadlineFor(size int64) time.Duration {
	if f.Deadline != 0 {
		return f.Deadline
	}
	transfer := 2 * time.Duration(size/max(f.MinRate, 1)) * time.Second
	attempts := time.Duration(f.Retries+1) * max(f.StallTimeout, f.RateWindow)
	pauses := f.Backoff * time.Duration(1<<min(f.Retries, 20)-1)
	return time.Minute + transfer + attempts + pauses
}

// limitOf is the size bound of a sink that has one (documents), else 0.
func limitOf(s Sink) int64 {
	if b, ok := s.(*bufferSink); ok {
		return b.b.limit
	}
	return 0
}

// permanent marks failures that another attempt cannot fix.
type permanent struct{ error }

// ErrNotFound is what a fetch of a file the channel does not have wraps (HTTP 404, or no
// such file in a file:// channel): a client probing for the next version of something
// tells "none yet" from a failure by it.
var ErrNotFound = errors.New("not in the channel")

// notFound says its error as it is, and is ErrNotFound.
type notFound struct{ error }

func (n notFound) Unwrap() error        { return n.error }
func (n notFound) Is(target error) bool { return target == ErrNotFound }

func (p permanent) Unwrap() error { return p.error }

// download streams rel into sink, resuming with HTTP ranges after a cut. size is the exact
// size expected (-1: unknown, read to the end). h, when set, hashes every byte written.
func (f *Fetcher) download(ctx context.Context, channel, rel string, size int64, sink Sink, h hash.Hash) (err error) {
	u, err := fileURL(channel, rel)
	if err != nil {
		return permanent{err}
	}
	deadline := f.deadlineFor(max(size, limitOf(sink)))
	ctx, cancel := context.WithTimeoutCause(ctx, deadline, errDeadline)
	defer cancel()
	defer func() {
		// Said as what happened: the overall deadline, not "context deadline exceeded".
		if errors.Is(context.Cause(ctx), errDeadline) && err != nil {
			err = permanent{fmt.Errorf("fetching %s: gave up after %s, the overall deadline for it: the server is too slow, or keeps failing (%v)", rel, deadline, err)}
		}
	}()
	var done int64
	backoff := f.Backoff
	var last error
	for attempt := 0; attempt <= f.Retries; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				if errors.Is(context.Cause(ctx), errDeadline) {
					return last // the deferred rewrite names the deadline, with the real failure
				}
				return ctx.Err()
			case <-time.After(backoff):
			}
			backoff *= 2
		}
		n, err := f.attempt(ctx, u, rel, done, size, sink, h)
		done += n
		if err == nil {
			return nil
		}
		last = err
		var p permanent
		if errors.As(err, &p) || ctx.Err() != nil {
			return err
		}
		if f.Retrying != nil && attempt < f.Retries {
			f.Retrying(Retry{File: rel, Attempt: attempt + 2, Of: f.Retries + 1, Wait: backoff, Err: err})
		}
	}
	return fmt.Errorf("fetching %s: giving up after %d attempts: %w", rel, f.Retries+1, last)
}

// attempt makes one request from offset and copies what arrives, returning the bytes
// written.
func (f *Fetcher) attempt(ctx context.Context, u *url.URL, rel string, offset, size int64, sink Sink, h hash.Hash) (int64, error) {
	body, err := f.open(ctx, u, rel, offset, size)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	buf := make([]byte, bufferSize)
	var n int64
	for {
		m, rerr := body.Read(buf)
		if m > 0 {
			if size >= 0 && offset+n+int64(m) > size {
				return n, permanent{fmt.Errorf("%s: the server sent more than the %d bytes the release document lists", rel, size)}
			}
			if _, err := sink.Write(buf[:m]); err != nil {
				return n, permanent{fmt.Errorf("writing %s: %w", rel, err)}
			}
			if h != nil {
				h.Write(buf[:m])
			}
			n += int64(m)
			if f.Progress != nil {
				f.Progress(Progress{File: path.Base(rel), Done: offset + n, Total: size})
			}
		}
		if errors.Is(rerr, io.EOF) {
			if size >= 0 && offset+n < size {
				return n, fmt.Errorf("%s: connection ended after %d of %d bytes", rel, offset+n, size)
			}
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("reading %s: %w", rel, rerr)
		}
	}
}

// open starts reading rel at offset: a local file for file:// channels, an HTTP request
// (with a Range header when resuming) otherwise. The body aborts when it stalls.
func (f *Fetcher) open(ctx context.Context, u *url.URL, rel string, offset, size int64) (io.ReadCloser, error) {
	if u.Scheme == "file" {
		// Opened without blocking and checked before any read: a FIFO or a device in a
		// channel directory would otherwise hang the open or the read for ever.
		fh, err := os.OpenFile(u.Path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if errors.Is(err, os.ErrNotExist) {
			return nil, permanent{notFound{fmt.Errorf("fetching %s: %w", rel, err)}}
		}
		if err != nil {
			return nil, permanent{fmt.Errorf("fetching %s: %w", rel, err)}
		}
		if st, err := fh.Stat(); err != nil || !st.Mode().IsRegular() {
			fh.Close()
			if err == nil {
				err = fmt.Errorf("%s is not a regular file (%s)", u.Path, st.Mode().Type())
			}
			return nil, permanent{fmt.Errorf("fetching %s: %w", rel, err)}
		}
		if _, err := fh.Seek(offset, io.SeekStart); err != nil {
			fh.Close()
			return nil, permanent{err}
		}
		return fh, nil
	}
	rctx, cancelReq := context.WithCancel(ctx)
	// Why the request was given up, said instead of "context canceled".
	var why atomic.Pointer[string]
	giveUp := func(reason string) {
		why.CompareAndSwap(nil, &reason)
		cancelReq()
	}
	cancel := context.CancelFunc(cancelReq)
	// The stall timer runs from the request on: a server that never answers stalls too.
	timer := time.AfterFunc(f.StallTimeout, func() {
		giveUp(fmt.Sprintf("the server sent nothing for %s", f.StallTimeout))
	})
	explain := func(err error) error {
		if r := why.Load(); r != nil && ctx.Err() == nil {
			return errors.New(*r)
		}
		return err
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u.String(), nil)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, permanent{err}
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		timer.Stop()
		cancel()
		var ue *url.Error
		if strings.Contains(err.Error(), "stopped after") || (errors.As(err, &ue) && strings.Contains(ue.Err.Error(), "unsupported protocol scheme")) {
			// A redirect loop, or a redirect to a scheme liken never follows (ftp://, file://):
			// no other attempt can end differently.
			return nil, permanent{fmt.Errorf("fetching %s: %w", rel, err)}
		}
		var verr *tls.CertificateVerificationError
		if errors.As(err, &verr) {
			// The server's certificate is not one this machine trusts (a private CA not in
			// spec.channelCA, a name that does not match): asking again changes nothing.
			return nil, permanent{fmt.Errorf("fetching %s: %w", rel, err)}
		}
		return nil, fmt.Errorf("fetching %s: %w", rel, explain(err))
	}
	stop := cancel
	cancel = func() { timer.Stop(); stop() }
	switch {
	case offset > 0 && resp.StatusCode == http.StatusPartialContent:
		if !strings.HasPrefix(resp.Header.Get("Content-Range"), fmt.Sprintf("bytes %d-", offset)) {
			resp.Body.Close()
			cancel()
			return nil, permanent{fmt.Errorf("fetching %s: the server resumed at the wrong place (%s)", rel, resp.Header.Get("Content-Range"))}
		}
	case offset > 0 && resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		resp.Body.Close()
		cancel()
		return nil, permanent{fmt.Errorf("%s: the server has only %d of %d bytes (truncated)", rel, offset, size)}
	case offset > 0 && resp.StatusCode == http.StatusOK:
		// No range support: an honest restart would need the target rewound; refuse rather
		// than write the beginning twice.
		resp.Body.Close()
		cancel()
		return nil, permanent{fmt.Errorf("fetching %s: the server cannot resume (no Range support) after %d bytes", rel, offset)}
	case resp.StatusCode == http.StatusOK:
	default:
		resp.Body.Close()
		cancel()
		err := fmt.Errorf("fetching %s: %s", rel, resp.Status)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout {
			return nil, err
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, permanent{notFound{err}}
		}
		return nil, permanent{err}
	}
	return &stallReader{body: resp.Body, cancel: cancel, timer: timer, timeout: f.StallTimeout,
		giveUp: giveUp, explain: explain, minRate: f.MinRate, window: f.RateWindow, windowStart: time.Now()}, nil
}

// stallReader gives its request up when no byte arrives for timeout, or when fewer than
// minRate bytes a second arrive over a window.
type stallReader struct {
	body    io.ReadCloser
	cancel  context.CancelFunc
	timer   *time.Timer
	timeout time.Duration
	giveUp  func(reason string)
	explain func(error) error

	minRate     int64
	window      time.Duration
	windowStart time.Time
	windowBytes int64
}

func (s *stallReader) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if n > 0 {
		s.timer.Reset(s.timeout)
		s.windowBytes += int64(n)
		if elapsed := time.Since(s.windowStart); elapsed >= s.window {
			if rate := float64(s.windowBytes) / elapsed.Seconds(); rate < float64(s.minRate) {
				s.giveUp(fmt.Sprintf("the server is too slow: %d bytes in %s, less than the %d bytes a second required", s.windowBytes, elapsed.Round(time.Millisecond), s.minRate))
				return n, s.explain(context.Canceled)
			}
			s.windowStart, s.windowBytes = time.Now(), 0
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		err = s.explain(err)
	}
	return n, err
}

func (s *stallReader) Close() error {
	s.timer.Stop()
	s.cancel()
	return s.body.Close()
}

func fileURL(channel, rel string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSuffix(channel, "/"))
	if err != nil {
		return nil, fmt.Errorf("channel %q: %w", channel, err)
	}
	switch u.Scheme {
	case "http", "https", "file":
	default:
		return nil, fmt.Errorf("channel %q: only http://, https:// and file:// channels are read", channel)
	}
	u.Path = u.Path + "/" + rel
	return u, nil
}

type limitedBuffer struct {
	data  []byte
	limit int64
}

type bufferSink struct{ b *limitedBuffer }

func (s *bufferSink) Write(p []byte) (int, error) {
	if int64(len(s.b.data)+len(p)) > s.b.limit {
		return 0, fmt.Errorf("more than %d bytes", s.b.limit)
	}
	s.b.data = append(s.b.data, p...)
	return len(p), nil
}
func (s *bufferSink) Commit() error  { return nil }
func (s *bufferSink) Discard() error { s.b.data = nil; return nil }

// PrintProgress reports a download's progress on w, a line per file every 10%.
func PrintProgress(w io.Writer) func(Progress) {
	last := map[string]int64{}
	return func(p Progress) {
		if p.Total <= 0 {
			return
		}
		step := p.Done * 10 / p.Total
		if prev, ok := last[p.File]; ok && prev == step {
			return
		}
		last[p.File] = step
		fmt.Fprintf(w, "  %s %3d%% (%d of %d bytes)\n", p.File, step*10, p.Done, p.Total)
	}
}
