package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.dev/liken/internal/logfile"
)

// components are the logs `liken logs` reads, by --component: the names init keeps them by
// in /var/log on the machine (internal/logfile).
var components = map[string]string{"init": logfile.Init, "agent": logfile.Agent, "k3s": logfile.K3s, "kernel": logfile.Kernel}

// followEvery is how often -f looks for new lines.
const followEvery = 2 * time.Second

func newLogs() *cobra.Command {
	var (
		k         kubeFlags
		component string
		boot      int
		tail      int
		follow    bool
		since     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "logs MACHINE",
		Short: "print a machine's logs (init's, the agent's, k3s's or the kernel's) through the Kubernetes API",
		Long: `Prints a machine's own logs, which it keeps on its state partition under /var/log (this
boot's, and those of the boots before, as many as the Cluster's spec.logs.bootsKept):
init's lines (the console's), the kernel's messages, the agent's and k3s's output. They are
read through the API server from the machine's kubelet (GET
/api/v1/nodes/MACHINE/proxy/logs/...), so no shell is needed, and who may read them is the
cluster's own RBAC: the verb get on nodes/proxy.

--boot -1 reads the boot before this one, -2 the one before that. -f follows this boot's
log as it grows, across a reboot of the machine too (it starts again from the new boot's
first line). --since 1h prints only the lines written in the last hour, by each line's own
time (init's lines carry the time they were written, the agent's and k3s's their logs'
timestamps; a line without one goes with the line before it); the kernel's lines carry the
time since boot, so --since does not apply to them.`,
		Example: `  liken logs worker-7
  liken logs worker-7 --component init --boot -1
  liken logs server-1 --component k3s --tail 100 -f
  liken logs worker-7 --since 30m
  kubectl get --raw "/api/v1/nodes/worker-7/proxy/logs/?query=liken-agent"   # the same file`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ok := components[component]
			if !ok {
				return usageErr("--component %q: give one of init, agent, k3s, kernel", component)
			}
			if boot > 0 {
				return usageErr("--boot %d: give 0 (this boot) or a negative number (-1: the boot before)", boot)
			}
			if follow && boot != 0 {
				return usageErr("-f follows this boot's log: leave --boot out")
			}
			if tail < -1 {
				return usageErr("--tail %d: give a number of lines, or -1 for all", tail)
			}
			if since < 0 {
				return usageErr("--since %s: give how far back, such as 30m or 2h", since)
			}
			if since > 0 && component == "kernel" {
				return usageErr("--since: the kernel's lines carry the time since boot, not a date; use --tail")
			}
			cc, _ := k.client()
			cfg, err := cc.ClientConfig()
			if err != nil {
				return fmt.Errorf("reading the kubeconfig: %w", err)
			}
			nl, err := newNodeLogs(cfg, args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			dir := ""
			if boot < 0 {
				if dir, err = nl.bootDir(ctx, -boot); err != nil {
					return err
				}
			}
			text, size, err := nl.read(ctx, dir, name)
			if err != nil {
				return err
			}
			if since > 0 {
				text = linesSince(text, time.Now().Add(-since))
			}
			if tail >= 0 {
				text = lastLines(text, tail)
			}
			out.Write(text)
			if !follow {
				return nil
			}
			return nl.follow(ctx, name, size, followEvery, out, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&component, "component", "agent", "whose log: init, agent, k3s or kernel")
	cmd.Flags().IntVar(&boot, "boot", 0, "which boot: 0 this one, -1 the one before, ...")
	cmd.Flags().IntVar(&tail, "tail", -1, "print only the last N lines (-1: all)")
	cmd.Flags().DurationVar(&since, "since", 0, "print only the lines of the last DURATION (such as 30m), by each line's time")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing this boot's log as it grows")
	k.add(cmd)
	return cmd
}

// nodeLogs reads one machine's log files through the API server's proxy to its kubelet.
type nodeLogs struct {
	rc   rest.Interface
	node string
}

func newNodeLogs(cfg *rest.Config, node string) (*nodeLogs, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &nodeLogs{rc: cs.CoreV1().RESTClient(), node: node}, nil
}

// get fetches /logs/PATH from the node's kubelet (a directory's listing when PATH ends in
// "/"), with a Range header when from > 0. It returns the body and the status code; a
// range past the end is no error.
func (n *nodeLogs) get(ctx context.Context, path string, from int64) ([]byte, int, error) {
	// One segment: AbsPath keeps its trailing slash, which a directory's listing needs.
	req := n.rc.Get().AbsPath("/api/v1/nodes/" + n.node + "/proxy/logs/" + path)
	if from > 0 {
		req = req.SetHeader("Range", fmt.Sprintf("bytes=%d-", from))
	}
	var code int
	body, err := req.Do(ctx).StatusCode(&code).Raw()
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Code == http.StatusRequestedRangeNotSatisfiable {
		return nil, http.StatusRequestedRangeNotSatisfiable, nil
	}
	if err != nil {
		return nil, code, n.explain(path, err)
	}
	return body, code, nil
}

// explain turns the API server's refusals into what the user can do about them.
func (n *nodeLogs) explain(path string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("reading %s's logs: the cluster does not let you (the verb get on nodes/proxy: kubectl auth can-i get nodes/proxy): %w", n.node, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("reading %s's logs: no %s there (is %s a machine of this cluster, running a liken that keeps its logs?): %w", n.node, "/var/log/"+path, n.node, err)
	}
	return fmt.Errorf("reading %s's logs (/var/log/%s): %w", n.node, path, err)
}

var hrefRE = regexp.MustCompile(`<a href="([^"]+)">`)

// list names the entries of a directory under /var/log, from the kubelet's listing.
func (n *nodeLogs) list(ctx context.Context, dir string) ([]string, error) {
	body, _, err := n.get(ctx, dir+"/", 0)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range hrefRE.FindAllSubmatch(body, -1) {
		names = append(names, string(m[1]))
	}
	return names, nil
}

// bootDir is the directory of the boot back boots before this one.
func (n *nodeLogs) bootDir(ctx context.Context, back int) (string, error) {
	entries, err := n.list(ctx, logfile.BootsDir)
	if err != nil {
		return "", fmt.Errorf("listing the boots whose logs %s keeps: %w", n.node, err)
	}
	var seqs []int
	for _, e := range entries {
		if s, err := strconv.Atoi(strings.TrimSuffix(e, "/")); err == nil && strings.HasSuffix(e, "/") {
			seqs = append(seqs, s)
		}
	}
	sort.Ints(seqs)
	if back > len(seqs) {
		return "", fmt.Errorf("%s keeps the logs of %d boots before this one, not %d (the Cluster's spec.logs.bootsKept)", n.node, len(seqs), back)
	}
	return fmt.Sprintf("%s/%d", logfile.BootsDir, seqs[len(seqs)-back]), nil
}

// read is a component's whole log in dir: its rotated file (NAME.log.1, older) and then
// NAME.log, with NAME.log's size, from which -f goes on.
func (n *nodeLogs) read(ctx context.Context, dir, name string) ([]byte, int64, error) {
	entries, err := n.list(ctx, dir)
	if err != nil {
		return nil, 0, err
	}
	files := logfile.Files(name, entries)
	if !slices.Contains(files, name+".log") {
		where := "this boot"
		if dir != "" {
			where = "that boot"
		}
		return nil, 0, fmt.Errorf("%s has no %s.log for %s (kept in /var/log%s: %s)", n.node, name, where, strings.TrimPrefix("/"+dir, "/"), strings.Join(entries, " "))
	}
	var all []byte
	var size int64
	for _, f := range files {
		p := f
		if dir != "" {
			p = dir + "/" + f
		}
		body, _, err := n.get(ctx, p, 0)
		if err != nil {
			return nil, 0, err
		}
		all = append(all, body...)
		size = int64(len(body))
	}
	return all, size, nil
}

// follow prints what is appended to this boot's NAME.log from offset on, every poll, until
// ctx ends. A file smaller than what was read (rotated, or a new boot's) is read from its
// start. A failed read is said once on errOut (the machine rebooting, the API server away),
// and following goes on.
func (n *nodeLogs) follow(ctx context.Context, name string, offset int64, poll time.Duration, out, errOut io.Writer) error {
	said := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
		body, code, err := n.get(ctx, name+".log", offset)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// The machine rebooting, the API server away: say so once, and keep looking.
			if err.Error() != said {
				said = err.Error()
				fmt.Fprintf(errOut, "liken logs: %v (still following)\n", err)
			}
			continue
		case code == http.StatusRequestedRangeNotSatisfiable:
			// Nothing new, or a shorter file: see which.
			whole, _, err := n.get(ctx, name+".log", 0)
			if err == nil && int64(len(whole)) < offset {
				out.Write(whole)
				offset = int64(len(whole))
			}
			continue
		case code == http.StatusOK && offset > 0:
			// The Range was ignored: the whole file came back.
			if int64(len(body)) >= offset {
				body = body[offset:]
			}
		}
		said = ""
		out.Write(body)
		offset += int64(len(body))
	}
}

// lastLines is the last n lines of b.
func lastLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	i := end
	for k := 0; k < n; k++ {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 0 {
			return b
		}
		i = j
		if k == n-1 {
			return b[i+1:]
		}
	}
	return b[i+1:]
}

// Where a line's time is, in the logs liken keeps: init's lines start with it (RFC 3339),
// the agent's are JSON with "time", k3s's own (logrus) have time="...", and the Kubernetes
// components' (klog) start with a severity, the month and day, and the time of day.
var (
	rfc3339Start = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}))\s`)
	jsonTime     = regexp.MustCompile(`"time":"([^"]+)"`)
	logrusTime   = regexp.MustCompile(`\btime="([^"]+)"`)
	klogTime     = regexp.MustCompile(`^[IWEF](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d+) `)
)

// lineTime is the time a log line says it was written, if it says.
func lineTime(line []byte, now time.Time) (time.Time, bool) {
	for _, re := range []*regexp.Regexp{rfc3339Start, jsonTime, logrusTime} {
		if m := re.FindSubmatch(line); m != nil {
			if t, err := time.Parse(time.RFC3339Nano, string(m[1])); err == nil {
				return t, true
			}
		}
	}
	if m := klogTime.FindSubmatch(line); m != nil {
		// klog gives no year: this year's, unless that is in the future (December's lines
		// read in January).
		for _, y := range []int{now.Year(), now.Year() - 1} {
			t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", fmt.Sprintf("%d-%s-%s %s", y, m[1], m[2], m[3]), time.Local)
			if err == nil && !t.After(now.Add(24*time.Hour)) {
				return t, true
			}
		}
	}
	return time.Time{}, false
}

// linesSince keeps the lines written at or after from, by each line's own time; a line
// without one goes with the line before it (a continuation), and lines before the first
// that has one go with that first one.
func linesSince(b []byte, from time.Time) []byte {
	now := time.Now()
	lines := bytes.SplitAfter(b, []byte("\n"))
	keep := make([]bool, len(lines))
	verdict, known := false, false
	firstKnown := -1
	for i, l := range lines {
		if t, ok := lineTime(l, now); ok {
			verdict, known = !t.Before(from), true
			if firstKnown < 0 {
				firstKnown = i
			}
		}
		keep[i] = known && verdict
	}
	for i := 0; i < firstKnown; i++ {
		keep[i] = keep[firstKnown]
	}
	var out []byte
	for i, l := range lines {
		if keep[i] {
			out = append(out, l...)
		}
	}
	return out
}
