package cli

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/install"
)

func newInstall() *cobra.Command {
	var (
		out       output
		o         install.Options
		size      string
		slotMiB   int
		layerOnly bool
	)
	cmd := &cobra.Command{
		Use:   "install --channel URL --pin DIGEST --layer FILE --disk PATH",
		Short: "write a release and a layer to a disk or disk image",
		Long: `Writes the pinned release into slot A of a disk (or a disk image file), with the boot
loader, the deployment layer and an empty state partition. The pin must be a release the
channel's keys signed, checked from the root the layer's Cluster names (spec.channelRoot) or
--trusted-root before anything of it is fetched; a channel taken unsigned
(spec.insecureUnsignedChannel, or --insecure-unsigned) is installed from unverified, and
said so. Every byte of the release is checked against the pin as it is written. A disk that is not empty is refused unless
--wipe; an image file this command created is removed again when the install fails.

With --layer-only, only the layer of an installed disk is replaced, by a newer one of the same
cluster and role (built again with more Machines, say): its slots, boot loader and state are
left alone, and the machine reads the new layer at its next boot; a server then makes the
Machines that are missing. --channel and --pin are not needed. The new layer is bound as an
install binds it: to --machine, else to the machine the disk was installed for (a different
--machine is refused), else it must hold one machine's credentials only.`,
		Example: `  liken install --channel file:///srv/channel --pin sha256:... --layer layer/server.layer --disk /dev/sdb --machine server-1
  liken install --channel https://releases.example.com/liken --pin sha256:... --layer layer/agent.layer \
      --disk agent-1.img --size 4G --machine agent-1
  liken install --layer-only --layer layer/server.layer --disk server-1.img --machine server-1`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if layerOnly {
				if o.Layer == "" || o.Disk == "" {
					return usageErr("--layer-only needs --layer and --disk")
				}
				if err := out.check(); err != nil {
					return err
				}
				res, err := install.ReplaceLayer(o)
				if err != nil {
					return err
				}
				return out.print(cmd.OutOrStdout(), res, func(w io.Writer) {
					fmt.Fprintf(w, "replaced the layer of %s with %s (%s)%s; the machine reads it at its next boot\n", o.Disk, o.Layer, res.LayerDigest, forMachine(res.Machine))
				})
			}
			if o.Channel == "" || o.Pin == "" || o.Layer == "" || o.Disk == "" {
				return usageErr("--channel, --pin, --layer and --disk are required")
			}
			if !apirelease.ValidDigest(o.Pin) {
				return usageErr("--pin %q is not a digest: give sha256: followed by 64 lowercase hexadecimal digits", o.Pin)
			}
			if size != "" {
				n, err := parseMiB(size)
				if err != nil {
					return usageErr("--size: %v", err)
				}
				o.SizeMiB = n
			}
			if st, err := os.Stat(o.Disk); err == nil && st.IsDir() {
				return usageErr("--disk %s is a directory; give a block device or a disk image file", o.Disk)
			}
			o.Layout = disk.DefaultLayout
			o.Layout.SlotMiB = slotMiB
			o.Fetcher = fetcher(cmd.ErrOrStderr())
			if err := out.check(); err != nil {
				return err
			}
			// The steps are the result in text; with -o they are progress, on stderr.
			o.Log = cmd.OutOrStdout()
			if out.format != "" {
				o.Log = cmd.ErrOrStderr()
			}
			res, err := install.Install(cmd.Context(), o)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), res, func(io.Writer) {})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Channel, "channel", "", "release channel URL (http://, https://, file://)")
	f.StringVar(&o.Pin, "pin", "", "digest of the release to install")
	f.StringVar(&o.Version, "version", "", "the release's version (default: looked up in the channel's index)")
	f.StringVar(&o.Layer, "layer", "", "deployment layer (server.layer or agent.layer from liken layer)")
	f.StringVar(&o.LayerDigest, "layer-digest", "", "the layer's digest as liken layer printed it: a layer with other bytes is refused")
	f.StringVar(&o.Disk, "disk", "", "block device or disk image file to write")
	f.StringVar(&o.Machine, "machine", "", "bind the disk to this Machine, keeping only its credential (needed for a layer of several machines)")
	f.BoolVar(&o.Wipe, "wipe", false, "erase a disk that is not empty")
	f.BoolVar(&layerOnly, "layer-only", false, "replace only the layer of an installed disk with a newer one of the same cluster and role")
	f.StringVar(&o.KernelArgs, "kernel-args", "", "extra kernel arguments for every boot")
	f.StringVar(&o.TrustedRoot, "trusted-root", "", "the digest of the channel's signed root: install only what its keys signed (default: the layer's Cluster's spec.channelRoot)")
	f.BoolVar(&o.InsecureUnsigned, "insecure-unsigned", false, "install from a channel without signed metadata, unverified (loudly; default: the layer's Cluster's spec.insecureUnsignedChannel)")
	f.StringVar(&size, "size", "", "create --disk as an image file of this size (such as 4G or 3072M)")
	f.IntVar(&slotMiB, "slot-size", disk.DefaultLayout.SlotMiB, "size of each slot in MiB")
	out.add(cmd)
	return cmd
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

func forMachine(m string) string {
	if m == "" {
		return ""
	}
	return " for machine " + m
}
