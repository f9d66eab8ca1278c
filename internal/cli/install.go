package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/install"
	"liken.dev/liken/internal/release"
)

func runInstall(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o install.Options
	fs.StringVar(&o.Channel, "channel", "", "release channel URL (http://, https://, file://)")
	fs.StringVar(&o.Pin, "pin", "", "digest of the release to install")
	fs.StringVar(&o.Version, "version", "", "the release's version (default: looked up in the channel's index)")
	fs.StringVar(&o.Layer, "layer", "", "deployment layer (server.layer or agent.layer from liken layer)")
	fs.StringVar(&o.Disk, "disk", "", "block device or disk image file to write")
	fs.StringVar(&o.Machine, "machine", "", "bind the disk to this Machine (keeps only its credential)")
	fs.BoolVar(&o.Wipe, "wipe", false, "erase a disk that is not empty")
	fs.StringVar(&o.KernelArgs, "kernel-args", "", "extra kernel arguments for every boot")
	size := fs.String("size", "", "create --disk as an image file of this size (such as 4G or 3072M)")
	slotMiB := fs.Int("slot-size", disk.DefaultLayout.SlotMiB, "size of each slot in MiB")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: liken install --channel URL --pin DIGEST --layer FILE --disk PATH [--machine NAME] [--size SIZE] [--wipe]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return errUsage
	}
	if o.Channel == "" || o.Pin == "" || o.Layer == "" || o.Disk == "" {
		fs.Usage()
		return fmt.Errorf("%w: --channel, --pin, --layer and --disk are required", errUsage)
	}
	if *size != "" {
		n, err := parseMiB(*size)
		if err != nil {
			return fmt.Errorf("%w: --size: %v", errUsage, err)
		}
		o.SizeMiB = n
	}
	o.Layout = disk.DefaultLayout
	o.Layout.SlotMiB = *slotMiB
	o.Fetcher = &release.Fetcher{Progress: progressPrinter(stderr)}
	o.Log = stdout
	return install.Install(ctx, o)
}

// parseMiB reads a size such as 4G, 3072M or 3072 (MiB).
func parseMiB(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "G"):
		mult, s = 1024, strings.TrimSuffix(s, "G")
	case strings.HasSuffix(s, "M"):
		s = strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a size such as 4G or 3072M", s)
	}
	return n * mult, nil
}
