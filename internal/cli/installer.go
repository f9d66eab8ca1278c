package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/internal/installer"
)

func newInstaller() *cobra.Command {
	var (
		out output
		o   installer.Options
	)
	build := &cobra.Command{
		Use:   "build --channel URL --pin DIGEST --layer FILE [--layer FILE...] [--out FILE] [--netboot DIR]",
		Short: "write an installer image (ISO for CD and virtual media, and for USB sticks)",
		Long: `Writes one image that boots by UEFI as a CD-ROM, a BMC's virtual media, or written to a USB
stick (dd if=FILE of=/dev/sdX). It carries the pinned release, checked first as liken install
checks it (signed by the channel's keys from the root the layers' Cluster names, each file
against the pinned document), with the channel's signed metadata, and the layers.

Booted, it installs the machine with no one at the keyboard: it finds the machine's Machine
in the layers by its spec.match (a MAC or the serial number; or the one Machine the layers
hold), installs the disk its spec.install.disk names (or the one disk that can be it) as liken
install does, and reboots into it. A disk that is not empty is refused, unless the Machine's
spec.install.wipe names its serial and content ID (both shown by the refusal); on a refusal
it says why on the console and powers off after a minute, with nothing written.

With --netboot DIR, the same installer boots from the network: serve DIR by TFTP or HTTP and
give bootx64.efi as the DHCP boot file (UEFI PXE or HTTP boot), or chain liken.ipxe from
iPXE. GRUB checks the kernel and initramfs against the release's digests built into it, and
the installer checks its files as a CD's.

The copy of the channel's signed metadata expires when the channel's timestamp does (a week
after it was signed, by default): build the image again from the channel after that.`,
		Example: `  liken installer build --channel https://releases.example.com/liken --pin sha256:... \
      --layer layer/server.layer --layer layer/agent.layer --out liken-installer.iso --netboot /srv/tftp/liken`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Channel == "" || o.Pin == "" || len(o.Layers) == 0 || (o.Out == "" && o.Netboot == "") {
				return usageErr("--channel, --pin, --layer and --out or --netboot (or both) are required")
			}
			if !apirelease.ValidDigest(o.Pin) {
				return usageErr("--pin %q is not a digest: give sha256: followed by 64 lowercase hexadecimal digits", o.Pin)
			}
			if st, err := os.Stat(o.Out); err == nil && st.IsDir() {
				return usageErr("--out %s is a directory; give the image file to write", o.Out)
			}
			if err := out.check(); err != nil {
				return err
			}
			o.Fetcher = fetcher(cmd.ErrOrStderr())
			o.Log = cmd.OutOrStdout()
			if out.format != "" {
				o.Log = cmd.ErrOrStderr()
			}
			m, err := installer.Build(cmd.Context(), o)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), m, func(w io.Writer) {
				if o.Out != "" {
					fmt.Fprintf(w, "boot it as a CD or virtual media, or write it to a USB stick: dd if=%s of=/dev/sdX bs=4M conv=fsync\n", o.Out)
				}
				if o.Netboot != "" {
					fmt.Fprintf(w, "serve %s by TFTP or HTTP; the DHCP boot file is %s (UEFI), or chain %s from iPXE\n", o.Netboot, installer.NetbootEFI, installer.NetbootIPXE)
				}
			})
		},
	}
	f := build.Flags()
	f.StringVar(&o.Channel, "channel", "", "release channel URL (http://, https://, file://)")
	f.StringVar(&o.Pin, "pin", "", "digest of the release to install")
	f.StringVar(&o.Version, "version", "", "the release's version (default: looked up in the channel's index)")
	f.StringArrayVar(&o.Layers, "layer", nil, "deployment layer (server.layer, agent.layer from liken layer); repeat for each")
	f.StringVar(&o.KernelArgs, "kernel-args", "", "extra kernel arguments for the installer's boot and every boot of the machines it installs")
	f.BoolVar(&o.InsecureUnsigned, "insecure-unsigned", false, "take the channel without signed metadata, unverified (loudly; default: the layers' Cluster's spec.insecureUnsignedChannel)")
	f.StringVar(&o.Out, "out", "", "the image file to write")
	f.StringVar(&o.Netboot, "netboot", "", "a directory to write the same installer's network boot into (GRUB for UEFI PXE or HTTP boot, an iPXE script, the kernel, initramfs and installer archive)")
	out.add(build)
	return group(&cobra.Command{Use: "installer", Short: "build the image that installs machines from a CD, virtual media or a USB stick"}, build)
}
