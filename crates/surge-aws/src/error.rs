//! AWS SDK errors as [`CloudError`]s that say what happened and what to do.

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use surge_cloud::{Action, CloudError};

/// Error codes AWS uses when the caller's credentials are expired or wrong.
const CREDENTIAL_CODES: &[&str] =
    &["ExpiredToken", "ExpiredTokenException", "RequestExpired", "AuthFailure", "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch"];
/// Codes of throttling (the SDK retries these with backoff before we see them).
const THROTTLE_CODES: &[&str] = &["RequestLimitExceeded", "Throttling", "ThrottlingException", "EC2ThrottledException", "TooManyRequestsException"];

/// What kind of failure an SDK error is, for tests and callers that react.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    NotFound,
    Credentials,
    Throttled,
    Permission,
    InUse,
    /// EBS refused a modification: the previous one has not completed, or the
    /// volume reached its modification limit (6 h, or 4 per rolling 24 h).
    ModifyRefused,
    /// AWS has no room for the volume now (InsufficientVolumeCapacity): a
    /// later try, or another type or zone, may work.
    Capacity,
    /// An account or instance limit (VolumeLimitExceeded, AttachmentLimitExceeded):
    /// lasts until something is deleted, detached or the quota raised.
    Limit,
    Other,
}

/// Codes of a refused ModifyVolume (EBS's modification limits).
const MODIFY_REFUSED_CODES: &[&str] = &["VolumeModificationRateExceeded", "VolumeModificationRateExceededException", "IncorrectModificationState"];

/// Codes of refusals that the SDK's retries (milliseconds apart) cannot
/// change: the call fails at once and the stack's controller retries it
/// later, with its own backoff, serving on what it has meanwhile.
pub fn retried_later(kind: Kind) -> bool {
    matches!(kind, Kind::Capacity | Kind::Limit)
}

pub fn kind_of_code(code: Option<&str>) -> Kind {
    match code {
        Some(c) if CREDENTIAL_CODES.contains(&c) => Kind::Credentials,
        Some(c) if THROTTLE_CODES.contains(&c) => Kind::Throttled,
        Some("UnauthorizedOperation" | "AccessDenied" | "AccessDeniedException") => Kind::Permission,
        Some("InvalidVolume.NotFound" | "InvalidInstanceID.NotFound") => Kind::NotFound,
        Some("VolumeInUse" | "IncorrectState" | "InvalidVolume.ZoneMismatch") => Kind::InUse,
        Some(c) if MODIFY_REFUSED_CODES.contains(&c) => Kind::ModifyRefused,
        Some("InsufficientVolumeCapacity" | "InsufficientInstanceCapacity") => Kind::Capacity,
        Some("VolumeLimitExceeded" | "AttachmentLimitExceeded" | "MaxIOPSLimitExceeded" | "InstanceLimitExceeded" | "VcpuLimitExceeded") => Kind::Limit,
        _ => Kind::Other,
    }
}

/// Map an SDK error of one call. `attempts` is the retry budget, for the throttling message.
pub fn map<E, R>(action: Action, volume: &str, api: &str, attempts: u32, err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let volume = volume.to_string();
    let code = err.code().map(str::to_string);
    let msg = err.message().unwrap_or_default().to_string();
    let why = match (kind_of_code(code.as_deref()), &err) {
        (Kind::NotFound, _) if !volume.is_empty() && code.as_deref() == Some("InvalidVolume.NotFound") => {
            return CloudError::NotFound { action, volume };
        }
        (Kind::ModifyRefused, _) => {
            return CloudError::Busy {
                action,
                volume,
                why: format!(
                    "{api}: EBS refused the modification ({}: {msg}); a volume is modified again only once its previous \
                     modification completed and within EBS's limit (6 hours apart, or 4 per rolling 24 hours); \
                     nothing was changed, and surge does not retry it before the rule allows (see `[aws] modify_rules`)",
                    code.unwrap_or_default()
                ),
            }
        }
        (Kind::InUse, _) => return CloudError::Busy { action, volume, why: format!("{api}: {} ({msg})", code.unwrap_or_default()) },
        (Kind::Credentials, _) => format!(
            "{api}: AWS refused the credentials ({}: {msg}); they are expired or invalid: refresh them \
             (aws sso login, a new session token, or the instance profile) and retry",
            code.unwrap_or_default()
        ),
        (Kind::Throttled, _) => format!(
            "{api}: AWS throttled the request ({}) on each of {attempts} attempts with exponential backoff; \
             nothing was changed by this call: retry later, or raise aws.max_attempts",
            code.unwrap_or_default()
        ),
        (Kind::Capacity, _) => format!(
            "{api}: AWS has no capacity for this volume now ({}: {msg}); not retried at once: \
             surge serves on what it has and tries again later with a backoff (another type or zone may work)",
            code.unwrap_or_default()
        ),
        (Kind::Limit, _) => format!(
            "{api}: a limit of the account or instance is reached ({}: {msg}); not retried at once: \
             surge serves on what it has and tries again later with a backoff; detach or delete volumes, \
             or raise the quota (Service Quotas, EBS)",
            code.unwrap_or_default()
        ),
        (Kind::Permission, _) => format!(
            "{api}: not permitted ({}: {msg}); the IAM policy of these credentials needs ec2:{api} (see README, `surge serve --provider aws`)",
            code.unwrap_or_default()
        ),
        (_, SdkError::DispatchFailure(_) | SdkError::TimeoutError(_)) => {
            format!("{api}: could not reach AWS: {}", DisplayErrorContext(&err))
        }
        (_, SdkError::ConstructionFailure(_)) => format!(
            "{api}: could not make the request (no credentials or region? surge uses the usual AWS chain: \
             AWS_* variables, ~/.aws/config profiles, SSO, the instance profile): {}",
            DisplayErrorContext(&err)
        ),
        _ => match code {
            Some(c) => format!("{api}: {c}: {msg}"),
            None => format!("{api}: {}", DisplayErrorContext(&err)),
        },
    };
    CloudError::Remote { action, volume, why }
}

/// Stops the SDK from retrying capacity and limit refusals: AWS sends
/// InsufficientVolumeCapacity as a server error (500), which the standard
/// retry strategy would repeat `max_attempts` times within seconds, holding
/// the controller's tick for nothing. Runs after the SDK's own classifiers.
#[derive(Debug, Default)]
pub struct NoTightRetry;

impl NoTightRetry {
    fn code(err: &aws_smithy_runtime_api::client::interceptors::context::Error) -> Option<&str> {
        use aws_sdk_ec2::operation::{attach_volume::AttachVolumeError, create_volume::CreateVolumeError, modify_volume::ModifyVolumeError, run_instances::RunInstancesError};
        // Only these calls meet capacity and limits (the error type is erased here).
        if let Some(e) = err.downcast_ref::<CreateVolumeError>() {
            return e.code();
        }
        if let Some(e) = err.downcast_ref::<AttachVolumeError>() {
            return e.code();
        }
        if let Some(e) = err.downcast_ref::<RunInstancesError>() {
            return e.code();
        }
        err.downcast_ref::<ModifyVolumeError>().and_then(|e| e.code())
    }
}

impl aws_smithy_runtime_api::client::retries::classifiers::ClassifyRetry for NoTightRetry {
    fn classify_retry(&self, ctx: &aws_smithy_runtime_api::client::interceptors::context::InterceptorContext) -> aws_smithy_runtime_api::client::retries::classifiers::RetryAction {
        use aws_smithy_runtime_api::client::retries::classifiers::RetryAction;
        let Some(Err(err)) = ctx.output_or_error() else { return RetryAction::NoActionIndicated };
        match err.as_operation_error().and_then(Self::code) {
            Some(c) if retried_later(kind_of_code(Some(c))) => RetryAction::RetryForbidden,
            _ => RetryAction::NoActionIndicated,
        }
    }
    fn name(&self) -> &'static str {
        "surge: capacity and limit refusals are retried by the controller"
    }
    fn priority(&self) -> aws_smithy_runtime_api::client::retries::classifiers::RetryClassifierPriority {
        use aws_smithy_runtime_api::client::retries::classifiers::RetryClassifierPriority as P;
        P::run_after(P::transient_error_classifier())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        assert_eq!(kind_of_code(Some("RequestLimitExceeded")), Kind::Throttled);
        assert_eq!(kind_of_code(Some("ExpiredToken")), Kind::Credentials);
        assert_eq!(kind_of_code(Some("RequestExpired")), Kind::Credentials);
        assert_eq!(kind_of_code(Some("UnauthorizedOperation")), Kind::Permission);
        assert_eq!(kind_of_code(Some("VolumeInUse")), Kind::InUse);
        assert_eq!(kind_of_code(Some("InvalidVolume.NotFound")), Kind::NotFound);
        assert_eq!(kind_of_code(Some("VolumeModificationRateExceeded")), Kind::ModifyRefused);
        assert_eq!(kind_of_code(Some("IncorrectModificationState")), Kind::ModifyRefused);
        assert_eq!(kind_of_code(Some("InsufficientVolumeCapacity")), Kind::Capacity);
        assert_eq!(kind_of_code(Some("VolumeLimitExceeded")), Kind::Limit);
        assert_eq!(kind_of_code(Some("AttachmentLimitExceeded")), Kind::Limit);
        assert_eq!(kind_of_code(Some("InsufficientInstanceCapacity")), Kind::Capacity);
        assert_eq!(kind_of_code(Some("VcpuLimitExceeded")), Kind::Limit);
        assert_eq!(kind_of_code(Some("Throttling")), Kind::Throttled);
        assert_eq!(kind_of_code(Some("ExpiredTokenException")), Kind::Credentials);
        assert!(retried_later(Kind::Capacity) && retried_later(Kind::Limit));
        assert!(!retried_later(Kind::Throttled) && !retried_later(Kind::Credentials) && !retried_later(Kind::Other));
        assert_eq!(kind_of_code(Some("Whatever")), Kind::Other);
        assert_eq!(kind_of_code(None), Kind::Other);
    }
}
