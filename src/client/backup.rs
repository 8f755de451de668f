//! Typed calls of the backup methods ([`crate::api::backup`]).

use super::{Client, ClientError};
use crate::api::backup::{
    BackupCreateParams, BackupDeleteParams, BackupDeleteResult, BackupGetParams, BackupListParams,
    BackupStoreListParams, BackupView, StoreVolumeView,
};

impl Client {
    /// `backup_create`.
    pub async fn backup_create(&self, params: &BackupCreateParams) -> Result<BackupView, ClientError> {
        self.call("backup_create", params).await
    }

    /// `backup_restore`: a new volume with a backup's data.
    pub async fn backup_restore(
        &self,
        params: &crate::api::backup::BackupRestoreParams,
    ) -> Result<crate::api::volume::VolumeView, ClientError> {
        self.call("backup_restore", params).await
    }

    /// `backup_list`: talon's backups, of `volume` or all.
    pub async fn backup_list(&self, volume: Option<&str>) -> Result<Vec<BackupView>, ClientError> {
        let params = BackupListParams {
            volume: volume.map(str::to_owned),
        };
        self.call("backup_list", params).await
    }

    /// `backup_get`.
    pub async fn backup_get(&self, name: &str) -> Result<BackupView, ClientError> {
        let params = BackupGetParams {
            name: name.to_owned(),
        };
        self.call("backup_get", params).await
    }

    /// `backup_delete`; `from_store`: first from its target.
    pub async fn backup_delete(
        &self,
        name: &str,
        from_store: bool,
        wait: bool,
    ) -> Result<BackupDeleteResult, ClientError> {
        let params = BackupDeleteParams {
            name: name.to_owned(),
            from_store,
            wait,
            timeout_seconds: None,
        };
        self.call("backup_delete", params).await
    }

    /// `backup_store_list`: what `target` holds, of backup volume `volume` or all.
    pub async fn backup_store_list(
        &self,
        target: &str,
        credential_secret: Option<&str>,
        volume: Option<&str>,
    ) -> Result<Vec<StoreVolumeView>, ClientError> {
        let params = BackupStoreListParams {
            target: target.to_owned(),
            credential_secret: credential_secret.map(str::to_owned),
            volume: volume.map(str::to_owned),
        };
        self.call("backup_store_list", params).await
    }
}
