package manifest

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/datadisk"
)

// diskPaths checks each spec.disks device against the names liken's init resolves (it has no
// udev, and makes only some of udev's /dev/disk/by-id links): the API server takes any path
// under /dev, and a disk named otherwise would be NotFound at every boot, or be whichever
// disk the kernel happened to number so. The errors are reported as the object's own, as the
// API server reports a field it refuses.
func diskPaths(m *v1alpha1.Machine) field.ErrorList {
	var errs field.ErrorList
	for i, d := range m.Spec.Disks {
		if err := datadisk.CheckDevicePath(string(d.Device)); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("spec", "disks").Index(i).Child("device"), string(d.Device), err.Error()))
		}
	}
	return errs
}
