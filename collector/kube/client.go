package kube

import (
	"fmt"

	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewMetadataClient returns a metadata client for the Kubernetes API: from the
// pod's service account when kubeconfig is empty, else from the kubeconfig file. It
// reads any resource as PartialObjectMetadata: the API server sends only the objects'
// metadata, in protobuf (or JSON, from a server that cannot), and nothing else.
func NewMetadataClient(kubeconfig string) (metadata.Interface, error) {
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	// The metadata client sets the content types itself: protobuf preferred, JSON
	// accepted, and on each request the PartialObjectMetadata form.
	client, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	return client, nil
}

// RESTConfig returns the collector's configuration for the Kubernetes API: from the
// pod's service account when kubeconfig is empty, else from the kubeconfig file.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes in-cluster config (outside a pod, pass a kubeconfig): %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = "gpuscaler-collector"
	return cfg, nil
}
